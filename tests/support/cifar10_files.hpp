#pragma once
// Synthetic CIFAR-10 binary batches for the reader's tests and the end-to-end runs: records of a
// label byte and 3072 image bytes, with contents that depend on the record, channel, row and
// column, so a layout or offset mistake changes what is read.
#include <cstdint>
#include <string>
#include <vector>

namespace dptest {

/// The pixel a synthetic record holds at (channel, row, column): global_index numbers the
/// record across the batches of a folder, so equal records in two batches would be noticed.
uint8_t cifar10_pixel(int64_t global_index, int channel, int row, int column);
/// The label of that record (0..9).
uint8_t cifar10_label(int64_t global_index);

/// `records` records, numbered from `first`, as one batch file's bytes.
std::vector<uint8_t> cifar10_batch(int64_t first, int64_t records);

/// A folder laid out like the official archive's cifar-10-batches-bin: data_batch_1.bin ...
/// data_batch_5.bin with `per_train_batch` records each (numbered on across them), and
/// test_batch.bin with `test_records` records (numbered from 1000000).
void write_cifar10_folder(const std::string& dir, int64_t per_train_batch, int64_t test_records);

}  // namespace dptest
