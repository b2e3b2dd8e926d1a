#pragma once
// Where the kernel emulator's launches go (emu_runtime.hpp): by default they run at once; the
// emulated GPU (fake_cudart.cpp) installs a hook that records them instead while their stream is
// being captured into a CUDA graph. Uses no CUDA type but the stream's, so the fake libraries,
// compiled against the real CUDA headers, include it too.
#include <functional>
#include <string>

struct CUstream_st;

namespace dp_emu {

using Work = std::function<void()>;
using StreamHook = void (*)(CUstream_st* stream, Work work);

/// Installs `hook` (nullptr: run at once) for every launch after it.
void set_stream_hook(StreamHook hook);
/// A launch's work: through the hook, or at once.
void submit(CUstream_st* stream, Work work);
/// The message of the first kernel error since the last call ("" when none), then clears it
/// (for work that runs outside its launch: a replayed graph).
std::string take_kernel_error();

/// The launch census: counts one run of a kernel or library call by name, when its work runs
/// (so a replayed graph's launches count each time). The emulated GPU's library exports it to
/// tools as `dp_emu_census` (bench_launches): which kernels one training step runs, on a machine
/// without a GPU.
void count_work(const std::string& name);

}  // namespace dp_emu

extern "C" {
/// The census so far, one "count<TAB>name" line per name, sorted by name; with `in_order` != 0
/// one "1<TAB>name" line per run instead, in the order they ran (the first 100000 only). With
/// `reset` != 0 both start again from nothing. The text stays valid until the next call on the
/// thread. One census per process: replicas in threads of their own count into it together
/// (their runs interleaved in the order list).
const char* dp_emu_census(int reset, int in_order);
}
