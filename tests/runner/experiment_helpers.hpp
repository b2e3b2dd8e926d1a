#pragma once
// Parsing experiment files in tests: a hand-made catalog stands in for the plugins, and helpers
// return the errors of a file that must not parse.
#include <catch2/catch.hpp>
#include <string>
#include <vector>

#include "experiment/experiment.hpp"

namespace exptest {

using dprun::ConfigError;
using dprun::ConfigErrors;
using dprun::Experiment;

inline dprun::ModelCatalog fake_catalog() {
  dprun::ModelCatalog c;
  dp::ModelFactory lenet;
  lenet.name = "lenet";
  lenet.options = {
      {"hidden", int64_t{128}, ""}, {"pool", std::string("avg"), ""}, {"init_std", 0.01, ""}};
  dp::ModelFactory resnet;
  resnet.name = "resnet18";
  resnet.options = {{"width", int64_t{64}, ""}};
  c.models["lenet"] = lenet;
  c.models["resnet18"] = resnet;
  return c;
}

inline Experiment parse(const std::string& text, dprun::ParseOptions options = {}) {
  return dprun::parse_experiment("t.toml", text, fake_catalog(), options);
}

/// The errors of a file that must not parse.
inline std::vector<ConfigError> errors_of(const std::string& text) {
  try {
    parse(text);
  } catch (const ConfigErrors& e) {
    return e.errors();
  }
  FAIL("expected ConfigErrors for:\n" << text);
  return {};
}

/// The single error of a file with one problem.
inline ConfigError error_of(const std::string& text) {
  auto errors = errors_of(text);
  INFO(text);
  for (const auto& e : errors) INFO(e.what());
  REQUIRE(errors.size() == 1);
  return errors[0];
}

inline const std::string kHead = "[experiment]\nname = \"t\"\n";  // lines 1-2

}  // namespace exptest
