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

}  // namespace dp_emu
