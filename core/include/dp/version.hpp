#pragma once
namespace dp {
/// The dprun / libdpcore version ("0.1.0").
const char* version();
}  // namespace dp
