// The emulated GPU's CUDA runtime: the calls dprun's CUDA backend makes, against the real
// cuda_runtime_api.h, on host memory. Streams run their work when it is enqueued (so every
// stream is always idle and events are always complete), except while a stream is being
// captured: then its work, kernels (through the emulator's stream hook), copies, fills and the
// fake libraries' calls, is recorded, and cudaGraphLaunch runs the recording again. What the real
// runtime refuses during a capture (allocation, synchronisation, a second capture on the thread)
// is refused here too, so a step that would break its graph on a GPU breaks here.
#include <cuda_profiler_api.h>
#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device/fake_device.hpp"
#include "emu_stream.hpp"

struct CUstream_st {
  int device = 0;
  struct CUgraph_st* capture = nullptr;  // the graph being recorded, or null
};
struct CUgraph_st {
  std::vector<dp_emu::Work> work;
  CUstream_st* origin = nullptr;
};
struct CUgraphExec_st {
  std::vector<dp_emu::Work> work;
};
struct CUevent_st {
  int device = 0;
};

namespace dp_emu::device {
namespace {

thread_local int current_device = 0;
thread_local cudaError_t last_error = cudaSuccess;
thread_local int captures_on_thread = 0;  // cudaStreamCaptureModeThreadLocal: this thread's
thread_local std::string kernel_message;

std::mutex memory_mutex;
std::map<void*, size_t>& allocations() {
  static std::map<void*, size_t> a;
  return a;
}
std::atomic<size_t> allocated_bytes{0};

cudaError_t fail(cudaError_t e) {
  if (last_error == cudaSuccess) last_error = e;
  return e;
}

/// Every launch and library call on a stream comes here: recorded while it is captured.
void enqueue(CUstream_st* stream, Work work) {
  if (stream != nullptr && stream->capture != nullptr) {
    stream->capture->work.push_back(std::move(work));
    return;
  }
  work();
}

struct InstallHook {
  InstallHook() { dp_emu::set_stream_hook(&enqueue); }
} install_hook;

}  // namespace

int device_count() {
  const char* env = std::getenv("DPRUN_EMULATED_GPUS");
  return env != nullptr ? std::atoi(env) : 2;
}

void submit_library_work(cudaStream_t stream, const std::string& name, Work work) {
  enqueue(stream, [name, work = std::move(work)] {
    count_work(name);
    work();
  });
}

bool capturing_on_this_thread() { return captures_on_thread > 0; }

}  // namespace dp_emu::device

using namespace dp_emu::device;

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  *count = device_count();
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  current_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int device) {
  if (device < 0 || device >= device_count()) return fail(cudaErrorInvalidDevice);
  std::memset(prop, 0, sizeof(*prop));
  std::snprintf(prop->name, sizeof(prop->name), "dprun emulated GPU %d (the CPU)", device);
  prop->major = 9;
  prop->minor = 0;
  prop->multiProcessorCount = 4;
  prop->totalGlobalMem = kMemoryBytes;
  prop->warpSize = 32;
  prop->maxThreadsPerBlock = 1024;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}
cudaError_t cudaRuntimeGetVersion(int* v) {
  *v = 13000;
  return cudaSuccess;
}

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = last_error;
  last_error = cudaSuccess;
  return e;
}

const char* cudaGetErrorString(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorMemoryAllocation:
      return "out of memory (emulated GPU)";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal (emulated GPU)";
    case cudaErrorStreamCaptureUnsupported:
      return "operation not permitted when stream is capturing (emulated GPU)";
    case cudaErrorStreamCaptureInvalidated:
      return "capture invalidated (emulated GPU)";
    case cudaErrorLaunchFailure:
      return kernel_message.empty() ? "unspecified launch failure (emulated GPU)"
                                    : kernel_message.c_str();
    default:
      return "error (emulated GPU)";
  }
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  *p = nullptr;
  if (capturing_on_this_thread()) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(memory_mutex);
  if (allocated_bytes + bytes > kMemoryBytes) return fail(cudaErrorMemoryAllocation);
  const size_t rounded = (bytes + 255) / 256 * 256;
  *p = std::aligned_alloc(256, rounded == 0 ? 256 : rounded);
  if (*p == nullptr) return fail(cudaErrorMemoryAllocation);
  allocations()[*p] = bytes;
  allocated_bytes += bytes;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  if (capturing_on_this_thread()) return fail(cudaErrorStreamCaptureUnsupported);
  std::lock_guard<std::mutex> lock(memory_mutex);
  const auto it = allocations().find(p);
  if (it == allocations().end()) return fail(cudaErrorInvalidValue);
  allocated_bytes -= it->second;
  allocations().erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  *p = std::aligned_alloc(256, (bytes + 255) / 256 * 256 + 256);
  return *p != nullptr ? cudaSuccess : fail(cudaErrorMemoryAllocation);
}

cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  *total = kMemoryBytes;
  *free_bytes = kMemoryBytes - allocated_bytes;
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t bytes, cudaMemcpyKind,
                            cudaStream_t stream) {
  submit_library_work(stream, "cudaMemcpyAsync",
                      [dst, src, bytes] { std::memmove(dst, src, bytes); });
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* dst, int value, size_t bytes, cudaStream_t stream) {
  submit_library_work(stream, "cudaMemsetAsync",
                      [dst, value, bytes] { std::memset(dst, value, bytes); });
  return cudaSuccess;
}

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* stream, unsigned int) {
  *stream = new CUstream_st{current_device, nullptr};
  return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  if (stream != nullptr && stream->capture != nullptr) {
    delete stream->capture;
    --captures_on_thread;
  }
  delete stream;
  return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (stream != nullptr && stream->capture != nullptr)
    return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (stream != nullptr && stream->capture != nullptr)
    return fail(cudaErrorStreamCaptureUnsupported);
  return cudaSuccess;
}

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  if (stream == nullptr || stream->capture != nullptr) return fail(cudaErrorIllegalState);
  stream->capture = new CUgraph_st{{}, stream};
  ++captures_on_thread;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t stream, cudaGraph_t* graph) {
  *graph = nullptr;
  if (stream == nullptr || stream->capture == nullptr) return fail(cudaErrorIllegalState);
  *graph = stream->capture;
  stream->capture = nullptr;
  --captures_on_thread;
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  *exec = new CUgraphExec_st{graph->work};
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t stream) {
  if (stream != nullptr && stream->capture != nullptr)
    return fail(cudaErrorStreamCaptureUnsupported);
  for (const dp_emu::Work& w : exec->work) {
    w();
    const std::string error = dp_emu::take_kernel_error();
    if (!error.empty()) {
      kernel_message = "a kernel of a replayed graph failed: " + error;
      return fail(cudaErrorLaunchFailure);
    }
  }
  return cudaSuccess;
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* event, unsigned int) {
  *event = new CUevent_st{current_device};
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t* event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}
// Work runs when it is enqueued: an event is complete when recorded, and waiting on one is
// already satisfied (the callers order their threads on the host, as they must on a GPU too).
cudaError_t cudaEventRecord(cudaEvent_t, cudaStream_t) { return cudaSuccess; }
cudaError_t cudaEventQuery(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaEventSynchronize(cudaEvent_t) { return cudaSuccess; }
cudaError_t cudaStreamWaitEvent(cudaStream_t, cudaEvent_t, unsigned int) { return cudaSuccess; }
// No GPU clock here: every timed span reads 0.05 ms, less than the fake cuDNN's fastest
// algorithm (0.1 ms), so where the CUDA backend times its own kernels against cuDNN's (its 1x1
// forward), the measured choice takes its own, and the emulated runs exercise them; a test sets
// DPRUN_EMULATED_EVENT_MS to see cuDNN win. Never the host's speed: no emulated test depends on it.
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t, cudaEvent_t) {
  const char* v = std::getenv("DPRUN_EMULATED_EVENT_MS");
  *ms = v != nullptr && *v != '\0' ? std::strtof(v, nullptr) : 0.05f;
  return cudaSuccess;
}

cudaError_t cudaProfilerStart(void) { return cudaSuccess; }
cudaError_t cudaProfilerStop(void) { return cudaSuccess; }

}  // extern "C"
