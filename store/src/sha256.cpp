// sha256 of a byte string, hex: OpenSSL's (libcrypto) rather than an implementation of our own.
// Config hashes, TOML sources and plugin files are identified by it.
#include <openssl/evp.h>

#include <cstdio>

#include "dpstore/store.hpp"

namespace dps {

std::string sha256_hex(const std::string& bytes) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_Digest(bytes.data(), bytes.size(), digest, &length, EVP_sha256(), nullptr) != 1 ||
      length != 32) {
    throw StoreError("sha256: OpenSSL's EVP_Digest failed");
  }
  static const char kHex[] = "0123456789abcdef";
  std::string out(64, '0');
  for (unsigned i = 0; i < 32; ++i) {
    out[2 * i] = kHex[digest[i] >> 4];
    out[2 * i + 1] = kHex[digest[i] & 0xf];
  }
  return out;
}

}  // namespace dps
