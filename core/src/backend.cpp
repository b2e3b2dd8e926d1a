// dp::Backend itself: its messages, construction and memory. The ops' contracts are the
// contract_*.cpp files, step capture is capture.cpp; every public op checks its arguments once,
// for every backend, before the backend's *_impl runs, and handles empty batches itself, so no
// backend needs its own rule for them. Errors read "<backend> backend: <op>: <what is wrong>".
#include <string>

#include "backend_checker.hpp"

namespace dp {

using namespace checks;

std::string Backend::prefix(const char* op) const { return name() + " backend: " + op + ": "; }

// ---- memory -------------------------------------------------------------------------------------

void* Backend::allocate(size_t bytes) {
  refuse_while_capturing("allocate");
  return allocate_impl(bytes);
}

void Backend::synchronize() {
  refuse_while_capturing("synchronize");
  synchronize_impl();
}

void Backend::upload(void* dst, const void* host_src, size_t bytes) {
  refuse_while_capturing("upload");
  Checker(*this, "upload").pointers(dst, host_src, bytes);
  if (bytes > 0) upload_impl(dst, host_src, bytes);
}

void Backend::download(void* host_dst, const void* src, size_t bytes) {
  refuse_while_capturing("download");
  Checker(*this, "download").pointers(host_dst, src, bytes);
  if (bytes > 0) download_impl(host_dst, src, bytes);
}

void* Backend::allocate_host(size_t bytes) {
  refuse_while_capturing("allocate_host");
  return allocate_host_impl(bytes);
}

uint64_t Backend::upload_async(void* dst, const void* host_src, size_t bytes) {
  refuse_while_capturing("upload_async");
  Checker(*this, "upload_async").pointers(dst, host_src, bytes);
  return upload_async_impl(dst, host_src, bytes);
}

void Backend::wait_upload(uint64_t ticket) {
  refuse_while_capturing("wait_upload");
  wait_upload_impl(ticket);
}

void Backend::await_upload(uint64_t ticket) {
  refuse_while_capturing("await_upload");
  await_upload_impl(ticket);
}

void Backend::copy(void* dst, const void* src, size_t bytes) {
  Checker(*this, "copy").pointers(dst, src, bytes);
  if (bytes > 0 && dst != src) run([=, this] { copy_impl(dst, src, bytes); });
}

void Backend::fill(const Tensor& t, float value) {
  const Checker check(*this, "fill");
  if (t.dtype != DType::f32 && t.dtype != DType::i32) {
    check.fail(std::string("t must be f32 or i32, got ") + dtype_name(t.dtype));
  }
  check.tensor(t, t.dtype, "t");
  if (t.dtype == DType::i32) check.finite(value, "value");
  if (t.numel() > 0) run([=, this] { fill_impl(t, value); });
}

}  // namespace dp
