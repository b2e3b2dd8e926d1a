// The trial request and the record protocol between the runner and a trial process (see
// trial_process.hpp): JSON encoding and decoding, and the child's record writer.
#include <errno.h>
#include <unistd.h>

#include <cmath>
#include <stdexcept>
#include <system_error>

#include "process/trial_process.hpp"

namespace dprun {

// ---- request ---------------------------------------------------------------------------------

Json model_options_to_json(const dp::ModelOptions& options) {
  Json o = Json::object();
  for (const auto& [name, value] : options) {
    if (const auto* b = std::get_if<bool>(&value)) {
      o.set(name, Json::boolean(*b));
    } else if (const auto* i = std::get_if<int64_t>(&value)) {
      o.set(name, Json::integer(*i));
    } else if (const auto* d = std::get_if<double>(&value)) {
      // A float option must stay a float: "1" would come back as an int.
      Json n = Json::number(*d);
      std::string text = n.dump();
      if (text.find_first_of(".eE") == std::string::npos && n.type() == Json::Type::number)
        n = Json::parse(text + ".0");
      o.set(name, n);
    } else {
      o.set(name, Json::string(std::get<std::string>(value)));
    }
  }
  return o;
}

dp::ModelOptions model_options_from_json(const Json& json) {
  dp::ModelOptions options;
  for (const auto& [name, v] : json.members()) {
    switch (v.type()) {
      case Json::Type::boolean:
        options[name] = v.as_bool();
        break;
      case Json::Type::number:
        if (v.is_integer_text())
          options[name] = v.as_int();
        else
          options[name] = v.as_double();
        break;
      case Json::Type::string:
        options[name] = v.as_string();
        break;
      default:
        throw JsonError("model option \"" + name + "\": unsupported JSON type");
    }
  }
  return options;
}

namespace {

// Each field read names itself when it is missing or of the wrong type.
template <class F>
auto field(const Json& o, const std::string& key, F read) {
  try {
    return read(o.at(key));
  } catch (const JsonError& e) {
    throw JsonError("trial request: \"" + key + "\": " + e.what());
  }
}

}  // namespace

Json request_to_json(const TrialRequest& r) {
  Json o = Json::object();
  o.set("ordinal", Json::integer(r.ordinal));
  o.set("settings", settings_to_json(r.settings));
  o.set("model_options", model_options_to_json(r.model_options));
  o.set("data_path", Json::string(r.data_path));
  o.set("run", run_options_to_json(r.run));
  o.set("checkpoint_dir", Json::string(r.checkpoint_dir));
  if (r.resume.epoch > 0) {
    Json resume = Json::object();
    resume.set("epoch", Json::integer(r.resume.epoch));
    resume.set("model_path", Json::string(r.resume.model_path));
    resume.set("model_sha256", Json::string(r.resume.model_sha256));
    resume.set("optimizer_path", Json::string(r.resume.optimizer_path));
    resume.set("optimizer_sha256", Json::string(r.resume.optimizer_sha256));
    resume.set("best_epoch", Json::integer(r.resume.best_epoch));
    resume.set("best_test_acc", Json::number(r.resume.best_test_acc));
    o.set("resume", resume);
  }
  return o;
}

TrialRequest request_from_json(const Json& o) {
  TrialRequest r;
  r.ordinal = field(o, "ordinal", [](const Json& j) { return j.as_int(); });
  r.settings = field(o, "settings", [](const Json& j) { return settings_from_json(j); });
  r.model_options =
      field(o, "model_options", [](const Json& j) { return model_options_from_json(j); });
  r.data_path = field(o, "data_path", [](const Json& j) { return j.as_string(); });
  r.run = field(o, "run", [](const Json& j) { return run_options_from_json(j); });
  r.checkpoint_dir = field(o, "checkpoint_dir", [](const Json& j) { return j.as_string(); });
  if (o.has("resume")) {
    r.resume = field(o, "resume", [](const Json& j) {
      ResumePoint p;
      p.epoch = j.at("epoch").as_int();
      p.model_path = j.at("model_path").as_string();
      p.model_sha256 = j.at("model_sha256").as_string();
      p.optimizer_path = j.at("optimizer_path").as_string();
      p.optimizer_sha256 = j.at("optimizer_sha256").as_string();
      p.best_epoch = j.at("best_epoch").as_int();
      p.best_test_acc = j.at("best_test_acc").as_double();
      return p;
    });
  }
  return r;
}

// ---- records ---------------------------------------------------------------------------------

std::string encode_record(const TrialRecord& r) {
  Json o = Json::object();
  switch (r.kind) {
    case TrialRecord::Kind::start:
      o.set("type", Json::string("start"));
      o.set("backend", Json::string(r.start.backend));
      o.set("devices", Json::string(r.start.devices));
      o.set("plugin_path", Json::string(r.start.plugin_path));
      o.set("plugin_sha256", Json::string(r.start.plugin_sha256));
      o.set("oversubscribed", Json::boolean(r.start.oversubscribed));
      o.set("hosts", Json::string(r.start.hosts));
      {
        Json hosts = Json::array();
        for (const auto& h : r.rank_hosts) hosts.push(Json::string(h));
        o.set("rank_hosts", hosts);
      }
      break;
    case TrialRecord::Kind::epoch:
      o.set("type", Json::string("epoch"));
      o.set("epoch", Json::integer(r.epoch.epoch));
      // Every measured value, as the store lists them (a NaN encodes as null).
      for (const dps::EpochMetric& m : dps::epoch_metrics())
        o.set(m.name, m.real != nullptr ? Json::number(r.epoch.*m.real)
                                        : Json::integer(r.epoch.*m.integer));
      break;
    case TrialRecord::Kind::checkpoint:
      o.set("type", Json::string("checkpoint"));
      o.set("role", Json::string(r.checkpoint.role));
      o.set("epoch", Json::integer(r.checkpoint.epoch));
      o.set("path", Json::string(r.checkpoint.path));
      o.set("sha256", Json::string(r.checkpoint.sha256));
      o.set("bytes", Json::integer(r.checkpoint.bytes));
      o.set("optimizer_path", Json::string(r.checkpoint.optimizer_path));
      o.set("optimizer_sha256", Json::string(r.checkpoint.optimizer_sha256));
      break;
    case TrialRecord::Kind::done:
      o.set("type", Json::string("done"));
      break;
    case TrialRecord::Kind::diverged:
      o.set("type", Json::string("diverged"));
      o.set("reason", Json::string(r.message));
      break;
    case TrialRecord::Kind::skipped:
      o.set("type", Json::string("skipped"));
      o.set("reason", Json::string(r.message));
      break;
    case TrialRecord::Kind::error:
      o.set("type", Json::string("error"));
      o.set("message", Json::string(r.message));
      break;
  }
  return o.dump();
}

TrialRecord decode_record(const std::string& line) {
  Json o = Json::parse(line);
  TrialRecord r;
  const std::string& type = o.at("type").as_string();
  if (type == "start") {
    r.kind = TrialRecord::Kind::start;
    r.start.backend = o.at("backend").as_string();
    r.start.devices = o.at("devices").as_string();
    r.start.plugin_path = o.at("plugin_path").as_string();
    r.start.plugin_sha256 = o.at("plugin_sha256").as_string();
    r.start.oversubscribed = o.at("oversubscribed").as_bool();
    r.start.hosts = o.at("hosts").as_string();
    for (const Json& h : o.at("rank_hosts").items()) r.rank_hosts.push_back(h.as_string());
  } else if (type == "epoch") {
    r.kind = TrialRecord::Kind::epoch;
    r.epoch.epoch = o.at("epoch").as_int();
    for (const dps::EpochMetric& m : dps::epoch_metrics()) {
      if (m.real != nullptr) {
        r.epoch.*m.real = o.at(m.name).as_double();
      } else {
        r.epoch.*m.integer = o.at(m.name).as_int();
      }
    }
  } else if (type == "checkpoint") {
    r.kind = TrialRecord::Kind::checkpoint;
    r.checkpoint.role = o.at("role").as_string();
    r.checkpoint.epoch = o.at("epoch").as_int();
    r.checkpoint.path = o.at("path").as_string();
    r.checkpoint.sha256 = o.at("sha256").as_string();
    r.checkpoint.bytes = o.at("bytes").as_int();
    r.checkpoint.optimizer_path = o.at("optimizer_path").as_string();
    r.checkpoint.optimizer_sha256 = o.at("optimizer_sha256").as_string();
  } else if (type == "done") {
    r.kind = TrialRecord::Kind::done;
  } else if (type == "diverged") {
    r.kind = TrialRecord::Kind::diverged;
    r.message = o.at("reason").as_string();
  } else if (type == "skipped") {
    r.kind = TrialRecord::Kind::skipped;
    r.message = o.at("reason").as_string();
  } else if (type == "error") {
    r.kind = TrialRecord::Kind::error;
    r.message = o.at("message").as_string();
  } else {
    throw JsonError("unknown record type \"" + type + "\"");
  }
  return r;
}

void RecordWriter::write(const TrialRecord& record) { write_line(encode_record(record)); }

void RecordWriter::write_line(const std::string& text) {
  const std::string line = prefix_ + text + "\n";
  size_t done = 0;
  while (done < line.size()) {
    ssize_t n = ::write(fd_, line.data() + done, line.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw std::system_error(errno, std::generic_category(),
                              "writing a trial record to fd " + std::to_string(fd_));
    }
    done += static_cast<size_t>(n);
  }
}

}  // namespace dprun
