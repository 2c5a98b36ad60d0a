#include "runtime/state/training_state.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <openssl/rand.h>
#include <sys/stat.h>
#include <unistd.h>

#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <span>
#include <string_view>
#include <type_traits>
#include <vector>

namespace vf {
namespace {

constexpr char kMagic[] = "VFSTATE1";
constexpr size_t kMagicSize = 8;
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = kMagicSize + sizeof(uint32_t) + sizeof(uint64_t);
constexpr size_t kDigestSize = 32;

using Digest = std::array<uint8_t, kDigestSize>;

Digest Sha256(const void* data, size_t size) {
  Digest digest;
  unsigned int length = 0;
  if (EVP_Digest(data, size, digest.data(), &length, EVP_sha256(), nullptr) != 1 ||
      length != kDigestSize) {
    // Without a working SHA-256 no checkpoint can be trusted, and there is no error channel
    // here that a caller could act on.
    std::fprintf(stderr, "virtualflow: OpenSSL EVP_Digest(SHA-256) failed\n");
    std::abort();
  }
  return digest;
}

// A SHA-256 taken over pieces one after the other (OpenSSL's EVP interface). Not thread-safe.
class Sha256Stream {
 public:
  Sha256Stream() : ctx_(EVP_MD_CTX_new()) {
    Check(ctx_ != nullptr && EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) == 1);
  }
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  ~Sha256Stream() { EVP_MD_CTX_free(ctx_); }

  void Update(std::string_view piece) {
    Check(EVP_DigestUpdate(ctx_, piece.data(), piece.size()) == 1);
  }
  Digest Final() {
    Digest digest;
    unsigned int length = 0;
    Check(EVP_DigestFinal_ex(ctx_, digest.data(), &length) == 1 && length == kDigestSize);
    return digest;
  }

 private:
  static void Check(bool ok) {
    if (!ok) {
      // As in Sha256(): without a working SHA-256 no checkpoint can be trusted.
      std::fprintf(stderr, "virtualflow: OpenSSL SHA-256 failed\n");
      std::abort();
    }
  }

  EVP_MD_CTX* ctx_;
};

template <typename T>
T ByteSwap(T v) {
  auto bytes = std::bit_cast<std::array<uint8_t, sizeof(T)>>(v);
  for (size_t i = 0; i < sizeof(T) / 2; ++i) std::swap(bytes[i], bytes[sizeof(T) - 1 - i]);
  return std::bit_cast<T>(bytes);
}

// Appends little-endian fields to a byte string. Not thread-safe.
class Writer {
 public:
  explicit Writer(std::string* out) : out_(out) {}

  template <typename T>
  void Put(T v) {
    static_assert(std::is_arithmetic_v<T>);
    if constexpr (std::endian::native == std::endian::big) v = ByteSwap(v);
    out_->append(reinterpret_cast<const char*>(&v), sizeof(T));
  }

  template <typename T>
  void PutArray(const T* data, size_t n) {
    Put<uint64_t>(n);
    if constexpr (std::endian::native == std::endian::little) {
      out_->append(reinterpret_cast<const char*>(data), n * sizeof(T));
    } else {
      for (size_t i = 0; i < n; ++i) Put(data[i]);
    }
  }

 private:
  std::string* out_;
};

// Reads little-endian fields from a byte range, refusing to read past its end. Not thread-safe.
class Reader {
 public:
  Reader(std::string_view bytes, std::string_view source) : bytes_(bytes), source_(source) {}

  size_t remaining() const { return bytes_.size() - pos_; }

  template <typename T>
  Status Get(const char* field, T* v) {
    static_assert(std::is_arithmetic_v<T>);
    if (remaining() < sizeof(T)) return Corrupt(field, "ends inside the field");
    std::memcpy(v, bytes_.data() + pos_, sizeof(T));
    if constexpr (std::endian::native == std::endian::big) *v = ByteSwap(*v);
    pos_ += sizeof(T);
    return Status::Ok();
  }

  // A u64 count of elements of `element_size` bytes each, checked against what is left so a
  // forged count cannot make the caller allocate more than the input holds.
  Status GetCount(const char* field, size_t element_size, uint64_t* count) {
    VF_RETURN_IF_ERROR(Get(field, count));
    if (*count > remaining() / element_size) {
      return Corrupt(field, "declares " + std::to_string(*count) + " elements of " +
                                std::to_string(element_size) + " bytes but only " +
                                std::to_string(remaining()) + " bytes remain");
    }
    return Status::Ok();
  }

  template <typename T>
  Status GetVector(const char* field, std::vector<T>* v) {
    uint64_t n = 0;
    VF_RETURN_IF_ERROR(GetCount(field, sizeof(T), &n));
    v->resize(static_cast<size_t>(n));
    if (n > 0) std::memcpy(v->data(), bytes_.data() + pos_, static_cast<size_t>(n) * sizeof(T));
    if constexpr (std::endian::native == std::endian::big) {
      for (T& x : *v) x = ByteSwap(x);
    }
    pos_ += static_cast<size_t>(n) * sizeof(T);
    return Status::Ok();
  }

  Status GetString(const char* field, std::string* s) {
    uint64_t n = 0;
    VF_RETURN_IF_ERROR(GetCount(field, 1, &n));
    s->assign(bytes_.data() + pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return Status::Ok();
  }

  Status Corrupt(const char* field, const std::string& what) const {
    return DataLoss(std::string(source_) + ": corrupt field " + field + " at payload offset " +
                    std::to_string(pos_) + ": " + what);
  }

 private:
  std::string_view bytes_;
  std::string_view source_;
  size_t pos_ = 0;
};

Status Error(std::string_view source, const std::string& message) {
  return DataLoss(std::string(source) + ": " + message);
}

uint64_t LoadLittleEndian64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

uint32_t LoadLittleEndian32(const char* p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | static_cast<uint8_t>(p[i]);
  return v;
}

Status CheckNonNegative(std::string_view source, const char* field, int64_t v) {
  if (v >= 0) return Status::Ok();
  return Error(source, std::string("field ") + field + " is negative (" + std::to_string(v) + ")");
}

StatusCode CodeForErrno(int err) {
  switch (err) {
    case ENOENT:
    case ENOTDIR:
      return StatusCode::kNotFound;
    case EACCES:
    case EPERM:
    case EROFS:
    case EISDIR:
    case ENOSPC:
    case EDQUOT:
      return StatusCode::kFailedPrecondition;
    case EIO:
      return StatusCode::kUnavailable;
    default:
      return StatusCode::kInternal;
  }
}

Status SystemError(const std::string& path, const std::string& what, int err) {
  return {CodeForErrno(err), "checkpoint " + path + ": " + what + ": " + std::strerror(err)};
}

// Closes a file descriptor on scope exit unless released. Not thread-safe.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  FdCloser(const FdCloser&) = delete;
  FdCloser& operator=(const FdCloser&) = delete;
  ~FdCloser() {
    if (fd_ >= 0) close(fd_);
  }
  int release() {
    int fd = fd_;
    fd_ = -1;
    return fd;
  }

 private:
  int fd_;
};

Status WriteAll(int fd, std::string_view bytes, const std::string& path, const std::string& tmp) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = write(fd, bytes.data() + done, bytes.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return SystemError(path, "write " + tmp, errno);
    }
    done += static_cast<size_t>(n);
  }
  return Status::Ok();
}

// How many names CreateTempFile draws before it gives up: another file at a name of 16 random
// hex digits means someone plants files there, not chance.
constexpr int kTempNameAttempts = 8;

// Creates a new temporary file beside `path` (`path`.tmp.<16 random hex digits>), setting `tmp`
// to its name. The name cannot be guessed and the file must not exist yet, not even as a
// symbolic link: whoever can write the directory cannot make the writer follow a link planted at
// the name to a file of its choice.
Result<int> CreateTempFile(const std::string& path, std::string& tmp) {
  int error = EEXIST;
  for (int attempt = 0; attempt < kTempNameAttempts && error == EEXIST; ++attempt) {
    uint64_t bits = 0;
    if (RAND_bytes(reinterpret_cast<unsigned char*>(&bits), sizeof(bits)) != 1) {
      return SystemError(path, "draw a temporary file name", EIO);
    }
    char suffix[17];
    std::snprintf(suffix, sizeof(suffix), "%016llx", static_cast<unsigned long long>(bits));
    tmp = path + ".tmp." + suffix;
    const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd >= 0) return fd;
    error = errno;
  }
  const std::string failed = "create " + tmp;
  tmp.clear();  // nothing of ours to remove
  return SystemError(path, failed, error);
}

// How much of a piece is hashed before it is written: small enough that the bytes are still in
// the CPU's cache when write() copies them.
constexpr size_t kHashChunk = size_t{1} << 20;

// Writes the pieces to `fd`; with `trailer`, hashes each as it goes and appends the digest.
Status WritePieces(int fd, std::span<const std::string_view> pieces, Sha256Stream* trailer,
                   const std::string& path, const std::string& tmp) {
  for (std::string_view piece : pieces) {
    if (trailer == nullptr) {
      VF_RETURN_IF_ERROR(WriteAll(fd, piece, path, tmp));
      continue;
    }
    for (size_t at = 0; at < piece.size(); at += kHashChunk) {
      const std::string_view chunk = piece.substr(at, kHashChunk);
      trailer->Update(chunk);
      VF_RETURN_IF_ERROR(WriteAll(fd, chunk, path, tmp));
    }
  }
  if (trailer == nullptr) return Status::Ok();
  const Digest digest = trailer->Final();
  return WriteAll(fd, std::string_view(reinterpret_cast<const char*>(digest.data()), kDigestSize),
                  path, tmp);
}

// Everything up to the rename, `tmp` naming the temporary file once it exists; the caller
// removes `tmp`, when not empty, if this fails.
Status WriteTempFile(const std::string& path, std::string& tmp,
                     std::span<const std::string_view> pieces, Sha256Stream* trailer) {
  VF_ASSIGN_OR_RETURN(const int fd, CreateTempFile(path, tmp));
  FdCloser closer(fd);
  VF_RETURN_IF_ERROR(WritePieces(fd, pieces, trailer, path, tmp));
  if (fsync(fd) != 0) return SystemError(path, "fsync " + tmp, errno);
  // close() can report a deferred write error (NFS), so its result matters.
  if (close(closer.release()) != 0) return SystemError(path, "close " + tmp, errno);
  if (rename(tmp.c_str(), path.c_str()) != 0) {
    return SystemError(path, "rename " + tmp + " to " + path, errno);
  }
  return Status::Ok();
}

}  // namespace

std::string SerializeState(const TrainingState& state) {
  std::string out;
  size_t payload_estimate = 64 + state.job_fingerprint.size() + 4 * state.reducer_exponents.size() +
                            4 * state.parameters.size();
  for (const auto& slot : state.optimizer_slots) payload_estimate += 8 + 4 * slot.size();
  out.reserve(kHeaderSize + payload_estimate + kDigestSize);

  out.append(kMagic, kMagicSize);
  Writer w(&out);
  w.Put<uint32_t>(kVersion);
  const size_t length_offset = out.size();
  w.Put<uint64_t>(0);  // payload length, filled in below
  w.PutArray(state.job_fingerprint.data(), state.job_fingerprint.size());
  w.Put<uint64_t>(state.seed);
  w.Put<int64_t>(state.step);
  w.Put<int64_t>(state.data_epoch);
  w.Put<int64_t>(state.membership_epoch);
  w.Put<int64_t>(state.optimizer_steps);
  w.PutArray(state.reducer_exponents.data(), state.reducer_exponents.size());
  w.PutArray(state.parameters.data(), state.parameters.size());
  w.Put<uint64_t>(state.optimizer_slots.size());
  for (const auto& slot : state.optimizer_slots) w.PutArray(slot.data(), slot.size());

  uint64_t payload = out.size() - kHeaderSize;
  for (size_t i = 0; i < 8; ++i) out[length_offset + i] = static_cast<char>(payload >> (8 * i));
  Digest digest = Sha256(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(digest.data()), digest.size());
  return out;
}

Result<TrainingState> DeserializeState(std::string_view bytes, std::string_view source) {
  const std::string_view magic(kMagic, kMagicSize);
  if (bytes.substr(0, kMagicSize) != magic.substr(0, bytes.size())) {
    return Error(source, "not a VirtualFlow training state (bad magic)");
  }
  if (bytes.size() >= kMagicSize + sizeof(uint32_t)) {
    const uint32_t version = LoadLittleEndian32(bytes.data() + kMagicSize);
    if (version != kVersion) {
      return Error(source, "unsupported version " + std::to_string(version) +
                               " (this build reads version " + std::to_string(kVersion) + ")");
    }
  }
  if (bytes.size() < kHeaderSize + kDigestSize) {
    return Error(source, "truncated: " + std::to_string(bytes.size()) + " bytes, less than the " +
                             std::to_string(kHeaderSize + kDigestSize) +
                             " bytes of header and checksum");
  }
  const uint64_t payload = LoadLittleEndian64(bytes.data() + kMagicSize + sizeof(uint32_t));
  const uint64_t max_payload = std::numeric_limits<uint64_t>::max() - kHeaderSize - kDigestSize;
  if (payload > max_payload) {
    return Error(source, "truncated: " + std::to_string(bytes.size()) +
                             " bytes, but the header declares a payload of " +
                             std::to_string(payload) + " bytes");
  }
  const uint64_t expected = kHeaderSize + payload + kDigestSize;
  if (bytes.size() < expected) {
    return Error(source, "truncated: " + std::to_string(bytes.size()) + " of " +
                             std::to_string(expected) + " bytes");
  }
  if (bytes.size() > expected) {
    return Error(source, std::to_string(bytes.size() - expected) +
                             " bytes of trailing data after the " + std::to_string(expected) +
                             "-byte state");
  }
  const size_t signed_size = kHeaderSize + static_cast<size_t>(payload);
  Digest digest = Sha256(bytes.data(), signed_size);
  if (std::memcmp(digest.data(), bytes.data() + signed_size, kDigestSize) != 0) {
    return Error(source, "checksum mismatch: the data is corrupt or was modified");
  }

  // Past the checksum, a parse failure means a writer bug or a forged checksum, not bit rot;
  // it is still checked field by field so no input can crash the reader.
  TrainingState s;
  Reader r(bytes.substr(kHeaderSize, static_cast<size_t>(payload)), source);
  VF_RETURN_IF_ERROR(r.GetString("job_fingerprint", &s.job_fingerprint));
  VF_RETURN_IF_ERROR(r.Get("seed", &s.seed));
  VF_RETURN_IF_ERROR(r.Get("step", &s.step));
  VF_RETURN_IF_ERROR(r.Get("data_epoch", &s.data_epoch));
  VF_RETURN_IF_ERROR(r.Get("membership_epoch", &s.membership_epoch));
  VF_RETURN_IF_ERROR(r.Get("optimizer_steps", &s.optimizer_steps));
  VF_RETURN_IF_ERROR(r.GetVector("reducer_exponents", &s.reducer_exponents));
  VF_RETURN_IF_ERROR(r.GetVector("parameters", &s.parameters));
  uint64_t slots = 0;
  // Each slot takes at least its own 8-byte length.
  VF_RETURN_IF_ERROR(r.GetCount("optimizer_slots", sizeof(uint64_t), &slots));
  s.optimizer_slots.resize(static_cast<size_t>(slots));
  for (auto& slot : s.optimizer_slots) VF_RETURN_IF_ERROR(r.GetVector("optimizer_slots", &slot));
  if (r.remaining() != 0) {
    return Error(source, std::to_string(r.remaining()) +
                             " bytes of unparsed data at the end of the payload");
  }
  VF_RETURN_IF_ERROR(CheckNonNegative(source, "step", s.step));
  VF_RETURN_IF_ERROR(CheckNonNegative(source, "data_epoch", s.data_epoch));
  VF_RETURN_IF_ERROR(CheckNonNegative(source, "membership_epoch", s.membership_epoch));
  VF_RETURN_IF_ERROR(CheckNonNegative(source, "optimizer_steps", s.optimizer_steps));
  if (s.data_epoch > s.step) {
    // An epoch has at least one step, so the epoch can never run ahead of the step count.
    return Error(source, "data_epoch " + std::to_string(s.data_epoch) + " is past step " +
                             std::to_string(s.step));
  }
  return s;
}

namespace {

// Writes `pieces`, one after the other, to `path` so that a crash leaves either the old file or
// the new one; with `trailer`, followed by the SHA-256 of the pieces.
Status WriteAtomically(const std::string& path, std::span<const std::string_view> pieces,
                       Sha256Stream* trailer) {
  namespace fs = std::filesystem;
  const fs::path parent = fs::path(path).parent_path();
  if (!parent.empty()) {
    std::error_code ec;
    fs::create_directories(parent, ec);
    if (ec) return SystemError(path, "create directory " + parent.string(), ec.value());
  }
  std::string tmp;
  Status written = WriteTempFile(path, tmp, pieces, trailer);
  if (!written.ok()) {
    if (!tmp.empty()) unlink(tmp.c_str());
    return written;
  }
  // The rename is durable only once the directory entry is on disk.
  const std::string dir = parent.empty() ? "." : parent.string();
  int dir_fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0) return SystemError(path, "open directory " + dir, errno);
  FdCloser closer(dir_fd);
  if (fsync(dir_fd) != 0) return SystemError(path, "fsync directory " + dir, errno);
  return Status::Ok();
}

// The whole regular file at `path`; `what` names it in errors ("checkpoint").
Result<std::string> ReadWhole(const std::string& path, const std::string& what) {
  int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    if (errno == ENOENT) return NotFound(what + " " + path + " does not exist");
    return SystemError(path, "open", errno);
  }
  FdCloser closer(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return SystemError(path, "stat", errno);
  if (!S_ISREG(st.st_mode)) {
    return FailedPrecondition(what + " " + path + ": not a regular file");
  }
  std::string bytes;
  bytes.reserve(static_cast<size_t>(st.st_size));
  char buffer[1 << 16];
  for (;;) {
    ssize_t n = read(fd, buffer, sizeof(buffer));
    if (n < 0) {
      if (errno == EINTR) continue;
      return SystemError(path, "read", errno);
    }
    if (n == 0) break;
    bytes.append(buffer, static_cast<size_t>(n));
  }
  return bytes;
}

constexpr char kBlobMagic[] = "VFBLOB01";

}  // namespace

Status WriteCheckpoint(const std::string& path, const TrainingState& state) {
  const std::string bytes = SerializeState(state);
  const std::string_view piece(bytes);
  return WriteAtomically(path, {&piece, 1}, nullptr);
}

Result<TrainingState> ReadCheckpoint(const std::string& path) {
  VF_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(path, "checkpoint"));
  return DeserializeState(bytes, "checkpoint " + path);
}

namespace {

// SealBlob's first bytes: the magic and the payload's size.
std::string BlobHeader(std::span<const std::string_view> payload) {
  uint64_t size = 0;
  for (std::string_view piece : payload) size += piece.size();
  std::string header(kBlobMagic, kMagicSize);
  for (int i = 0; i < 8; ++i) header.push_back(static_cast<char>((size >> (8 * i)) & 0xff));
  return header;
}

}  // namespace

std::string SealBlob(std::string_view payload) { return SealBlob({&payload, 1}); }

std::string SealBlob(std::span<const std::string_view> payload) {
  std::string out = BlobHeader(payload);
  size_t size = out.size() + kDigestSize;
  for (std::string_view piece : payload) size += piece.size();
  out.reserve(size);
  for (std::string_view piece : payload) out.append(piece);
  const Digest digest = Sha256(out.data(), out.size());
  out.append(reinterpret_cast<const char*>(digest.data()), kDigestSize);
  return out;
}

Result<std::string> UnsealBlob(std::string_view bytes, std::string_view source) {
  const std::string where(source);
  constexpr size_t kBlobHeader = kMagicSize + sizeof(uint64_t);
  if (bytes.size() < kBlobHeader + kDigestSize ||
      bytes.substr(0, kMagicSize) != std::string_view(kBlobMagic, kMagicSize)) {
    return DataLoss(where + ": not a VirtualFlow state blob (wrong magic or truncated)");
  }
  const uint64_t size = LoadLittleEndian64(bytes.data() + kMagicSize);
  if (size != bytes.size() - kBlobHeader - kDigestSize) {
    return DataLoss(where + ": truncated or padded (header says " + std::to_string(size) +
                    " bytes of payload, " +
                    std::to_string(bytes.size() - kBlobHeader - kDigestSize) + " present)");
  }
  const Digest digest = Sha256(bytes.data(), kBlobHeader + size);
  if (std::memcmp(digest.data(), bytes.data() + kBlobHeader + size, kDigestSize) != 0) {
    return DataLoss(where + ": checksum mismatch: the data is corrupt or was modified");
  }
  return std::string(bytes.substr(kBlobHeader, size));
}

Status WriteSealedFile(const std::string& path, std::string_view payload) {
  return WriteSealedFile(path, {&payload, 1});
}

Status WriteSealedFile(const std::string& path, std::span<const std::string_view> payload) {
  // SealBlob's bytes, written without a sealed copy of the payload in memory: the header, the
  // pieces where they are and the digest of all, taken as they are written (a PyTorch job's
  // checkpoint is its whole state).
  const std::string header = BlobHeader(payload);
  std::vector<std::string_view> pieces;
  pieces.reserve(payload.size() + 1);
  pieces.push_back(header);
  pieces.insert(pieces.end(), payload.begin(), payload.end());
  Sha256Stream digest;
  return WriteAtomically(path, pieces, &digest);
}

Result<std::string> ReadSealedFile(const std::string& path) {
  VF_ASSIGN_OR_RETURN(std::string bytes, ReadWhole(path, "checkpoint"));
  return UnsealBlob(bytes, "checkpoint " + path);
}

std::string Sha256Hex(const void* data, size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  Digest digest = Sha256(data, size);
  std::string hex;
  hex.reserve(2 * kDigestSize);
  for (uint8_t b : digest) {
    hex.push_back(kDigits[b >> 4]);
    hex.push_back(kDigits[b & 0xf]);
  }
  return hex;
}

}  // namespace vf
