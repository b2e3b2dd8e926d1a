// The trial request and the record protocol between the runner and a trial process (see
// trial_process.hpp): JSON encoding and decoding, and the child's record writer.
#include <errno.h>
#include <unistd.h>

#include <cmath>
#include <stdexcept>
#include <system_error>

#include "base/json_fields.hpp"
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

// The members of each record type, named once for its encoder and its decoder.
const JsonFields<dps::TrialStart>& start_fields() {
  static const JsonFields<dps::TrialStart> f = {
      field("backend", &dps::TrialStart::backend),
      field("devices", &dps::TrialStart::devices),
      field("plugin_path", &dps::TrialStart::plugin_path),
      field("plugin_sha256", &dps::TrialStart::plugin_sha256),
      field("oversubscribed", &dps::TrialStart::oversubscribed),
      field("hosts", &dps::TrialStart::hosts),
      field("data_residence", &dps::TrialStart::data_residence),
      field("layout_used", &dps::TrialStart::layout_used),
      field("graphs_used", &dps::TrialStart::graphs_used),
  };
  return f;
}

const JsonFields<dps::CheckpointRow>& checkpoint_fields() {
  static const JsonFields<dps::CheckpointRow> f = {
      field("role", &dps::CheckpointRow::role),
      field("epoch", &dps::CheckpointRow::epoch),
      field("path", &dps::CheckpointRow::path),
      field("sha256", &dps::CheckpointRow::sha256),
      field("bytes", &dps::CheckpointRow::bytes),
      field("optimizer_path", &dps::CheckpointRow::optimizer_path),
      field("optimizer_sha256", &dps::CheckpointRow::optimizer_sha256),
  };
  return f;
}

const JsonFields<ResumePoint>& resume_fields() {
  static const JsonFields<ResumePoint> f = {
      field("epoch", &ResumePoint::epoch),
      field("model_path", &ResumePoint::model_path),
      field("model_sha256", &ResumePoint::model_sha256),
      field("optimizer_path", &ResumePoint::optimizer_path),
      field("optimizer_sha256", &ResumePoint::optimizer_sha256),
      field("best_epoch", &ResumePoint::best_epoch),
      field("best_test_acc", &ResumePoint::best_test_acc),
      field("stop_history", &ResumePoint::stop_history),
  };
  return f;
}

// Each field read names itself when it is missing or of the wrong type.
template <class F>
auto request_member(const Json& o, const std::string& key, F read) {
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
  if (r.resume.epoch > 0) o.set("resume", resume_fields().to_json(r.resume));
  if (r.stop_after_epoch > 0) o.set("stop_after_epoch", Json::integer(r.stop_after_epoch));
  return o;
}

TrialRequest request_from_json(const Json& o) {
  TrialRequest r;
  r.ordinal = request_member(o, "ordinal", [](const Json& j) { return j.as_int(); });
  r.settings = request_member(o, "settings", [](const Json& j) { return settings_from_json(j); });
  r.model_options =
      request_member(o, "model_options", [](const Json& j) { return model_options_from_json(j); });
  r.data_path = request_member(o, "data_path", [](const Json& j) { return j.as_string(); });
  r.run = request_member(o, "run", [](const Json& j) { return run_options_from_json(j); });
  r.checkpoint_dir =
      request_member(o, "checkpoint_dir", [](const Json& j) { return j.as_string(); });
  if (o.has("stop_after_epoch"))
    r.stop_after_epoch =
        request_member(o, "stop_after_epoch", [](const Json& j) { return j.as_int(); });
  if (o.has("resume")) {
    r.resume = request_member(o, "resume", [](const Json& j) {
      ResumePoint p;
      resume_fields().read(j, p, "resume point");
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
      start_fields().write(r.start, o);
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
      checkpoint_fields().write(r.checkpoint, o);
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
    case TrialRecord::Kind::stopped:
      o.set("type", Json::string("stopped"));
      o.set("reason", Json::string(r.message));
      break;
    case TrialRecord::Kind::paused:
      o.set("type", Json::string("paused"));
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
    start_fields().read(o, r.start, "start record");
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
    checkpoint_fields().read(o, r.checkpoint, "checkpoint record");
  } else if (type == "done") {
    r.kind = TrialRecord::Kind::done;
  } else if (type == "diverged") {
    r.kind = TrialRecord::Kind::diverged;
    r.message = o.at("reason").as_string();
  } else if (type == "skipped") {
    r.kind = TrialRecord::Kind::skipped;
    r.message = o.at("reason").as_string();
  } else if (type == "stopped") {
    r.kind = TrialRecord::Kind::stopped;
    r.message = o.at("reason").as_string();
  } else if (type == "paused") {
    r.kind = TrialRecord::Kind::paused;
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
