// A stand-in for the CUDA driver library (libcuda.so.1), put first on LD_LIBRARY_PATH by
// tests/runner/test_run_behaviour.cpp to hold README's "the runner never initialises CUDA".
// Every process that initialises CUDA calls cuInit: this one appends a line with its pid and
// command line to $DPRUN_FAKE_CUDA_LOG and answers "no device" (CUDA_ERROR_NO_DEVICE), so the
// process goes on as on a machine without a GPU. Loading the library is not initialising CUDA
// (cuBLASLt loads it in every process that links it); calling cuInit is.
//
// The CUDA runtime finds the driver's entry points through cuGetProcAddress: it gets cuInit and
// cuDriverGetVersion from here and nothing else, which it takes as a driver without a device.
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <string>

namespace {

constexpr int kSuccess = 0;
constexpr int kNoDevice = 100;  // CUDA_ERROR_NO_DEVICE
constexpr int kNotFound = 500;  // CUDA_ERROR_NOT_FOUND

void note_cuinit() {
  const char* log = std::getenv("DPRUN_FAKE_CUDA_LOG");
  if (log == nullptr || *log == '\0') return;
  std::string cmd;
  if (const int fd = ::open("/proc/self/cmdline", O_RDONLY); fd >= 0) {
    char buf[1024];
    for (ssize_t n; (n = ::read(fd, buf, sizeof buf)) > 0;) cmd.append(buf, static_cast<size_t>(n));
    ::close(fd);
  }
  for (char& c : cmd)
    if (c == '\0') c = ' ';
  const std::string line = "cuInit pid " + std::to_string(::getpid()) + ": " + cmd + "\n";
  // One write of one line: processes that run at once do not interleave.
  if (const int fd = ::open(log, O_WRONLY | O_CREAT | O_APPEND, 0644); fd >= 0) {
    (void)!::write(fd, line.data(), line.size());
    ::close(fd);
  }
}

}  // namespace

extern "C" {

__attribute__((visibility("default"))) int cuInit(unsigned int) {
  note_cuinit();
  return kNoDevice;
}

__attribute__((visibility("default"))) int cuDriverGetVersion(int* version) {
  if (version) *version = 13000;
  return kSuccess;
}

__attribute__((visibility("default"))) int cuGetProcAddress_v2(const char* symbol, void** pfn, int,
                                                               unsigned long long, int* status) {
  void* found = nullptr;
  if (std::strcmp(symbol, "cuInit") == 0) found = reinterpret_cast<void*>(&cuInit);
  if (std::strcmp(symbol, "cuDriverGetVersion") == 0)
    found = reinterpret_cast<void*>(&cuDriverGetVersion);
  if (std::strcmp(symbol, "cuGetProcAddress") == 0)
    found = reinterpret_cast<void*>(&cuGetProcAddress_v2);
  if (pfn) *pfn = found;
  if (status) *status = found ? 0 : 1;  // CU_GET_PROC_ADDRESS_SUCCESS or _SYMBOL_NOT_FOUND
  return found ? kSuccess : kNotFound;
}

__attribute__((visibility("default"))) int cuGetProcAddress(const char* symbol, void** pfn,
                                                            int version, unsigned long long flags) {
  return cuGetProcAddress_v2(symbol, pfn, version, flags, nullptr);
}

}  // extern "C"
