#pragma once
// The state behind dps::Store, shared by store.cpp (lifecycle) and query.cpp (read-only SQL).
#include <sqlite3.h>

#include <string>

#include "dpstore/store.hpp"

namespace dps {

struct Store::Impl {
  sqlite3* db = nullptr;
  std::string path;  // as given by the caller, for messages
  Mode mode = Mode::read_write;
  int user_version = 0;
  // Set by the query authorizer when it refuses an action, so query() can tell a refusal from
  // an ordinary SQL error.
  std::string refused_action;

  ~Impl();
};

}  // namespace dps
