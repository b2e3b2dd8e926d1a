// Process 0's side of a trial's checkpoints (see checkpoint_writer.hpp).
#include "trial/checkpoint_writer.hpp"

#include <cstdio>
#include <filesystem>

#include "dp/error.hpp"
#include "dp/safetensors.hpp"
#include "dp/version.hpp"

namespace dprun {

namespace fs = std::filesystem;

namespace {

std::string number_text(double x) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.17g", x);
  return buf;
}

dps::CheckpointRow write_file(const std::string& path, const std::string& role, int64_t epoch,
                              const std::string& bytes) {
  dp::write_bytes_atomically(path, bytes);
  dps::CheckpointRow row;
  row.role = role;
  row.epoch = epoch;
  row.path = path;
  row.sha256 = dps::sha256_hex(bytes);
  row.bytes = static_cast<int64_t>(bytes.size());
  return row;
}

}  // namespace

CheckpointWriter::CheckpointWriter(CheckpointMode mode, std::string dir, const ResumePoint& resume)
    : mode_(mode),
      dir_(std::move(dir)),
      best_epoch_(resume.best_epoch),
      best_test_acc_(resume.best_test_acc) {}

std::vector<dps::CheckpointRow> CheckpointWriter::after_epoch(const dp::Trainer& trainer,
                                                              const dp::EpochReport& report) {
  std::vector<dps::CheckpointRow> rows;
  if (!enabled()) return rows;
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec) throw dp::Error("cannot create the checkpoint folder " + dir_ + ": " + ec.message());
  dp::SafeTensorsFile model = trainer.model_state();
  model.metadata["epoch"] = std::to_string(report.epoch);
  model.metadata["test_acc"] = number_text(report.test_acc);
  model.metadata["dprun_version"] = dp::version();
  const std::string model_bytes = dp::encode_safetensors(model);
  const fs::path dir(dir_);
  if (mode_ == CheckpointMode::every) {
    char name[64];
    std::snprintf(name, sizeof name, "epoch-%04lld.safetensors",
                  static_cast<long long>(report.epoch));
    rows.push_back(write_file((dir / name).string(), "epoch", report.epoch, model_bytes));
  }
  // The optimizer's file first: a recorded last model always has its optimizer state beside it.
  const std::string optimizer_bytes = dp::encode_safetensors(trainer.optimizer_state());
  const std::string optimizer_path = (dir / "last.optimizer.safetensors").string();
  dp::write_bytes_atomically(optimizer_path, optimizer_bytes);
  dps::CheckpointRow last =
      write_file((dir / "last.safetensors").string(), "last", report.epoch, model_bytes);
  last.optimizer_path = optimizer_path;
  last.optimizer_sha256 = dps::sha256_hex(optimizer_bytes);
  rows.push_back(last);
  if (mode_ == CheckpointMode::best && (best_epoch_ == 0 || report.test_acc > best_test_acc_)) {
    best_epoch_ = report.epoch;
    best_test_acc_ = report.test_acc;
    rows.push_back(
        write_file((dir / "best.safetensors").string(), "best", report.epoch, model_bytes));
  }
  return rows;
}

namespace {

// Process 0's read of one file of the resume point, checked against its recorded sha256.
std::string read_checked(const std::string& path, const std::string& sha256, const char* what) {
  const std::string bytes = read_checkpoint_file(path);
  const std::string found = dps::sha256_hex(bytes);
  if (found != sha256)
    throw dp::Error("the " + std::string(what) + " " + path + " has sha256 " + found +
                    ", the database recorded " + sha256 +
                    " (changed since it was written?); run again with --restart to start the "
                    "trial from epoch 1");
  return bytes;
}

}  // namespace

void load_resume_point(dp::Trainer& trainer, const ResumePoint& resume, dp::ProcessGroup* group) {
  const int rank = group ? group->rank() : 0;
  std::string problem, model_bytes, optimizer_bytes;
  if (rank == 0) {
    try {
      model_bytes = read_checked(resume.model_path, resume.model_sha256, "model checkpoint");
      optimizer_bytes =
          read_checked(resume.optimizer_path, resume.optimizer_sha256, "optimizer state");
    } catch (const std::exception& e) {
      problem = e.what();
    }
  }
  // Every process learns whether process 0 could read them, then gets the bytes.
  if (group) {
    group->broadcast(problem, 0);
    if (problem.empty()) {
      group->broadcast(model_bytes, 0);
      group->broadcast(optimizer_bytes, 0);
    }
  }
  if (!problem.empty())
    throw dp::Error("cannot resume from epoch " + std::to_string(resume.epoch) + ": " + problem);
  try {
    const dp::SafeTensorsFile model = dp::decode_safetensors(model_bytes, resume.model_path);
    const dp::SafeTensorsFile optimizer =
        dp::decode_safetensors(optimizer_bytes, resume.optimizer_path);
    trainer.load_state(model, &optimizer);
  } catch (const dp::Error& e) {
    throw dp::Error("cannot resume from the checkpoint of epoch " + std::to_string(resume.epoch) +
                    " (" + resume.model_path + "): " + e.what() +
                    "; run again with --restart to start the trial from epoch 1");
  }
}

}  // namespace dprun
