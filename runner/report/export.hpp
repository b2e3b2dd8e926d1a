#pragma once
// `dprun export`: one trial's model checkpoint, copied out of the results after its sha256 is
// checked against the database's record. The command line is cli's.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "dpstore/store.hpp"

namespace dprun {

/// Which checkpoint of a trial: its last (the default), its best (checkpoint = "best"), or the
/// one of an epoch (checkpoint = "every", or the last or best one).
struct ExportChoice {
  bool best = false;
  std::optional<int64_t> epoch;
};

/// The checkpoint of `rows` (a trial's) that `which` names; a UsageError that says what the
/// trial kept otherwise.
dps::CheckpointRow choose_checkpoint(const dps::TrialRow& trial,
                                     const std::vector<dps::CheckpointRow>& rows,
                                     const ExportChoice& which);

/// Writes the checkpoint to `output` ("": trial-ID-epoch-N.safetensors here) after checking the
/// file's sha256 against the database, and says what it wrote. Returns the exit status: 1 when
/// the file is missing or changed (nothing written). UsageError for a trial or checkpoint the
/// database does not have.
int export_checkpoint(const std::string& db, int64_t trial_id, const ExportChoice& which,
                      const std::string& output);

}  // namespace dprun
