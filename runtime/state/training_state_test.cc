#include "runtime/state/training_state.h"

#include <gtest/gtest.h>
#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

namespace vf {
namespace {

namespace fs = std::filesystem;

constexpr size_t kHeaderSize = 20;  // magic, version, payload length
constexpr size_t kDigestSize = 32;

// A directory of its own for each test, removed afterwards. Not thread-safe.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "vf_state_test.XXXXXX").string();
    char* made = mkdtemp(pattern.data());
    EXPECT_NE(made, nullptr) << "mkdtemp failed";
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  std::string File(const std::string& name) const { return (fs::path(path_) / name).string(); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TrainingState SampleState() {
  TrainingState s;
  s.job_fingerprint = "sha256:0123abcd";
  s.seed = 0xfeedfacecafebeefULL;
  s.step = 1234;
  s.data_epoch = 5;
  s.membership_epoch = 7;
  s.optimizer_steps = 1230;
  s.reducer_exponents = {-3, 0, 17, std::numeric_limits<int32_t>::min()};
  s.parameters = {1.5f, -0.0f, 3.25e-8f, std::numeric_limits<float>::max(),
                  std::numeric_limits<float>::denorm_min()};
  s.optimizer_slots = {{0.1f, 0.2f, 0.3f, 0.4f, 0.5f}, {}, {9.0f, 8.0f, 7.0f, 6.0f, 5.0f}};
  return s;
}

std::string HexToBytes(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

void PutLittleEndian64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>(v >> (8 * i)));
}

// A state whose header and checksum are valid around an arbitrary payload, as a writer with a
// bug (or a forger) would produce.
std::string Seal(const std::string& payload) {
  std::string out = "VFSTATE1";
  out += std::string("\x01\x00\x00\x00", 4);
  PutLittleEndian64(&out, payload.size());
  out += payload;
  out += HexToBytes(Sha256Hex(out.data(), out.size()));
  return out;
}

std::string PayloadOf(const std::string& serialized) {
  return serialized.substr(kHeaderSize, serialized.size() - kHeaderSize - kDigestSize);
}

template <typename T>
void ExpectDataLoss(const Result<T>& r, const std::string& must_contain) {
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << r.status().ToString();
  EXPECT_NE(r.status().message().find(must_contain), std::string::npos)
      << "message: " << r.status().message() << "\nexpected to contain: " << must_contain;
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
}

std::string ReadFile(const std::string& path) {
  std::string bytes(static_cast<size_t>(fs::file_size(path)), '\0');
  std::ifstream f(path, std::ios::binary);
  f.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  EXPECT_TRUE(f.good()) << path;
  return bytes;
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary);
  f << bytes;
  ASSERT_TRUE(f.good());
}

TEST(SerializeState, RoundTripPreservesEveryField) {
  TrainingState s = SampleState();
  Result<TrainingState> back = DeserializeState(SerializeState(s), "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);
  // -0.0f == 0.0f, so compare the bits of the parameters too.
  ASSERT_EQ(back->parameters.size(), s.parameters.size());
  EXPECT_EQ(std::memcmp(back->parameters.data(), s.parameters.data(), s.parameters.size() * 4), 0);
}

TEST(SerializeState, RoundTripOfAnEmptyState) {
  TrainingState s;
  Result<TrainingState> back = DeserializeState(SerializeState(s), "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, s);

  TrainingState empty_slots;
  empty_slots.optimizer_slots = {{}, {}};
  back = DeserializeState(SerializeState(empty_slots), "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, empty_slots);
  EXPECT_EQ(back->optimizer_slots.size(), 2u);
}

TEST(SerializeState, RoundTripPreservesNaNBits) {
  TrainingState s;
  s.parameters = {std::nanf("0x123"), -std::numeric_limits<float>::infinity()};
  Result<TrainingState> back = DeserializeState(SerializeState(s), "test");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  ASSERT_EQ(back->parameters.size(), 2u);
  // NOLINTNEXTLINE(bugprone-suspicious-memory-comparison): the NaN's payload bits must survive.
  EXPECT_EQ(std::memcmp(back->parameters.data(), s.parameters.data(), 8), 0);
}

TEST(SerializeState, LayoutIsMagicVersionLengthFieldsChecksum) {
  TrainingState s;
  s.job_fingerprint = "ab";
  s.seed = 0x0102030405060708ULL;
  s.step = 3;
  s.reducer_exponents = {-2};
  s.parameters = {1.0f};
  s.optimizer_slots = {{2.0f}};
  const std::string bytes = SerializeState(s);

  std::string payload;
  PutLittleEndian64(&payload, 2);
  payload += "ab";
  PutLittleEndian64(&payload, 0x0102030405060708ULL);
  PutLittleEndian64(&payload, 3);                 // step
  PutLittleEndian64(&payload, 0);                 // data_epoch
  PutLittleEndian64(&payload, 0);                 // membership_epoch
  PutLittleEndian64(&payload, 0);                 // optimizer_steps
  PutLittleEndian64(&payload, 1);                 // one reducer exponent
  payload += std::string("\xfe\xff\xff\xff", 4);  // -2
  PutLittleEndian64(&payload, 1);                 // one parameter
  payload += std::string("\x00\x00\x80\x3f", 4);  // 1.0f
  PutLittleEndian64(&payload, 1);                 // one slot
  PutLittleEndian64(&payload, 1);                 // of one element
  payload += std::string("\x00\x00\x00\x40", 4);  // 2.0f
  EXPECT_EQ(bytes, Seal(payload));
}

TEST(SerializeState, IsDeterministic) {
  EXPECT_EQ(SerializeState(SampleState()), SerializeState(SampleState()));
}

TEST(DeserializeState, EveryTruncationIsDataLoss) {
  const std::string bytes = SerializeState(SampleState());
  for (size_t n = 0; n < bytes.size(); ++n) {
    Result<TrainingState> r = DeserializeState(std::string_view(bytes).substr(0, n), "rank 3");
    ASSERT_FALSE(r.ok()) << "prefix of " << n << " bytes accepted";
    EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << n;
    EXPECT_EQ(r.status().message().rfind("rank 3: truncated: ", 0), 0u)
        << n << ": " << r.status().message();
  }
  ExpectDataLoss(DeserializeState(std::string_view(bytes).substr(0, bytes.size() - 1), "r"),
                 "r: truncated: " + std::to_string(bytes.size() - 1) + " of " +
                     std::to_string(bytes.size()) + " bytes");
}

TEST(DeserializeState, EverySingleByteFlipIsDataLoss) {
  const std::string bytes = SerializeState(SampleState());
  for (size_t i = 0; i < bytes.size(); ++i) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}, uint8_t{0xff}}) {
      std::string tampered = bytes;
      tampered[i] = static_cast<char>(static_cast<uint8_t>(tampered[i]) ^ mask);
      Result<TrainingState> r = DeserializeState(tampered, "test");
      ASSERT_FALSE(r.ok()) << "byte " << i << " ^ " << int{mask} << " accepted";
      EXPECT_EQ(r.status().code(), StatusCode::kDataLoss) << i;
    }
  }
}

TEST(DeserializeState, FlippedPayloadByteIsAChecksumMismatch) {
  std::string bytes = SerializeState(SampleState());
  bytes[kHeaderSize + 3] ^= 0x10;
  ExpectDataLoss(DeserializeState(bytes, "checkpoint /x/y.ckpt"),
                 "checkpoint /x/y.ckpt: checksum mismatch: the data is corrupt or was modified");
}

TEST(DeserializeState, ForeignDataIsBadMagic) {
  ExpectDataLoss(DeserializeState("PK\x03\x04 this is a zip file, not a state", "rank 1"),
                 "rank 1: not a VirtualFlow training state (bad magic)");
  ExpectDataLoss(DeserializeState("VFX", "rank 1"), "rank 1: not a VirtualFlow training state");
}

TEST(DeserializeState, UnsupportedVersionIsDataLoss) {
  std::string bytes = SerializeState(SampleState());
  bytes[8] = 2;
  ExpectDataLoss(DeserializeState(bytes, "rank 0"),
                 "rank 0: unsupported version 2 (this build reads version 1)");
}

TEST(DeserializeState, TrailingBytesAreDataLoss) {
  std::string bytes = SerializeState(SampleState());
  bytes += "xyz";
  ExpectDataLoss(DeserializeState(bytes, "rank 0"), "rank 0: 3 bytes of trailing data");
}

TEST(DeserializeState, AbsurdPayloadLengthIsDataLoss) {
  std::string bytes = SerializeState(TrainingState{});
  for (uint64_t length : {std::numeric_limits<uint64_t>::max(), uint64_t{1} << 62,
                          std::numeric_limits<uint64_t>::max() - 40}) {
    std::string header;
    PutLittleEndian64(&header, length);
    bytes.replace(12, 8, header);
    ExpectDataLoss(DeserializeState(bytes, "rank 0"), "rank 0: truncated: ");
  }
}

TEST(DeserializeState, AbsurdElementCountsAreRejectedWithoutAllocating) {
  const std::string payload = PayloadOf(SerializeState(SampleState()));
  // The fingerprint's length is the first field; the parameter count follows the fixed fields
  // and the exponents.
  const size_t fingerprint_count = 0;
  const size_t exponents_count = 8 + 15 + 5 * 8;
  const size_t parameters_count = exponents_count + 8 + size_t{4} * 4;
  const size_t slots_count = parameters_count + 8 + size_t{5} * 4;
  for (size_t offset : {fingerprint_count, exponents_count, parameters_count, slots_count}) {
    for (uint64_t count :
         {std::numeric_limits<uint64_t>::max(), uint64_t{1} << 61, uint64_t{1000}}) {
      std::string forged = payload;
      std::string field;
      PutLittleEndian64(&field, count);
      forged.replace(offset, 8, field);
      ExpectDataLoss(DeserializeState(Seal(forged), "rank 2"), "rank 2: corrupt field ");
    }
  }
  // Sanity: the offsets above really are the count fields.
  std::string forged = payload;
  std::string field;
  PutLittleEndian64(&field, 2);
  forged.replace(slots_count, 8, field);
  Result<TrainingState> two_slots = DeserializeState(Seal(forged), "rank 2");
  ExpectDataLoss(two_slots, "bytes of unparsed data at the end of the payload");
}

TEST(DeserializeState, UnparsedPayloadBytesAreDataLoss) {
  const std::string payload = PayloadOf(SerializeState(SampleState()));
  ASSERT_TRUE(DeserializeState(Seal(payload), "rank 0").ok());
  ExpectDataLoss(DeserializeState(Seal(payload + "junk"), "rank 0"),
                 "rank 0: 4 bytes of unparsed data at the end of the payload");
}

TEST(DeserializeState, NegativeCountersAreDataLoss) {
  TrainingState s = SampleState();
  s.data_epoch = -1;
  ExpectDataLoss(DeserializeState(SerializeState(s), "rank 0"),
                 "rank 0: field data_epoch is negative (-1)");
  s = SampleState();
  s.step = -5;
  ExpectDataLoss(DeserializeState(SerializeState(s), "rank 0"), "field step is negative");
  s = SampleState();
  s.optimizer_steps = -1;
  ExpectDataLoss(DeserializeState(SerializeState(s), "rank 0"),
                 "field optimizer_steps is negative");
}

TEST(DeserializeState, DataEpochPastStepIsDataLoss) {
  TrainingState s = SampleState();
  s.step = 3;
  s.data_epoch = 4;
  ExpectDataLoss(DeserializeState(SerializeState(s), "rank 0"), "data_epoch 4 is past step 3");
}

TEST(Checkpoint, WriteThenReadRoundTrips) {
  TempDir dir;
  const std::string path = dir.File("job.ckpt");
  ASSERT_TRUE(WriteCheckpoint(path, SampleState()).ok());
  Result<TrainingState> back = ReadCheckpoint(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, SampleState());
  EXPECT_EQ(ReadFile(path), SerializeState(SampleState()));
}

TEST(Checkpoint, WriteCreatesMissingParentDirectories) {
  TempDir dir;
  const std::string path = dir.File("a/b/c/job.ckpt");
  Status s = WriteCheckpoint(path, SampleState());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_TRUE(ReadCheckpoint(path).ok());
}

TEST(Checkpoint, WriteReplacesTheOldCheckpointAndLeavesNoTempFile) {
  TempDir dir;
  const std::string path = dir.File("job.ckpt");
  TrainingState old_state = SampleState();
  ASSERT_TRUE(WriteCheckpoint(path, old_state).ok());
  TrainingState new_state = SampleState();
  new_state.step = 9999;
  new_state.parameters.push_back(42.0f);
  ASSERT_TRUE(WriteCheckpoint(path, new_state).ok());
  Result<TrainingState> back = ReadCheckpoint(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, new_state);
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"job.ckpt"});
}

TEST(Checkpoint, FailedWriteRemovesTheTempFileAndNamesThePath) {
  TempDir dir;
  // A directory where the checkpoint should go makes the rename fail after the temp file exists.
  const std::string path = dir.File("job.ckpt");
  fs::create_directory(path);
  fs::create_directory(path + "/inside");
  Status s = WriteCheckpoint(path, SampleState());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("checkpoint " + path + ": rename "), std::string::npos) << s.message();
  EXPECT_NE(s.message().find(std::strerror(EISDIR)), std::string::npos) << s.message();
  std::vector<std::string> names;
  for (const auto& entry : fs::directory_iterator(dir.path())) {
    names.push_back(entry.path().filename().string());
  }
  EXPECT_EQ(names, std::vector<std::string>{"job.ckpt"});  // no temporary file left
  EXPECT_TRUE(fs::is_directory(path + "/inside"));
}

// Whoever can write the checkpoint's directory cannot have the writer follow a symbolic link
// planted where its temporary file would go (the name it used to take, `path`.tmp.<pid>) to
// overwrite a file of their choice: the temporary file's name is drawn at random and the file
// is created new, never through a link.
TEST(Checkpoint, ASymlinkPlantedAtTheOldTempNameIsNotFollowed) {
  TempDir dir;
  const std::string path = dir.File("job.ckpt");
  const std::string victim = dir.File("victim");
  WriteFile(victim, "precious");
  const std::vector<std::string> planted = {path + ".tmp." + std::to_string(getpid()),
                                            path + ".tmp"};
  for (const std::string& link : planted) fs::create_symlink(victim, link);

  Status s = WriteCheckpoint(path, SampleState());
  ASSERT_TRUE(s.ok()) << s.ToString();
  EXPECT_EQ(ReadFile(victim), "precious");
  EXPECT_FALSE(fs::is_symlink(path));
  Result<TrainingState> back = ReadCheckpoint(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, SampleState());
  for (const std::string& link : planted) {
    EXPECT_TRUE(fs::is_symlink(link)) << link;
    EXPECT_EQ(fs::read_symlink(link), victim) << link;
  }
  // The sealed files of a PyTorch job go the same way.
  ASSERT_TRUE(WriteSealedFile(path, "payload").ok());
  EXPECT_EQ(ReadFile(victim), "precious");
}

TEST(Checkpoint, ParentThatIsAFileFailsWithThePath) {
  TempDir dir;
  WriteFile(dir.File("plain"), "x");
  Status s = WriteCheckpoint(dir.File("plain/job.ckpt"), SampleState());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find(dir.File("plain/job.ckpt")), std::string::npos) << s.message();
}

TEST(Checkpoint, ReadingAMissingFileIsNotFound) {
  TempDir dir;
  Result<TrainingState> r = ReadCheckpoint(dir.File("nope.ckpt"));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(r.status().message(), "checkpoint " + dir.File("nope.ckpt") + " does not exist");
}

TEST(Checkpoint, ReadingATamperedFileIsDataLossNamingTheFile) {
  TempDir dir;
  const std::string path = dir.File("job.ckpt");
  ASSERT_TRUE(WriteCheckpoint(path, SampleState()).ok());
  std::string bytes = ReadFile(path);
  bytes[bytes.size() / 2] ^= 0x04;
  WriteFile(path, bytes);
  ExpectDataLoss(ReadCheckpoint(path), "checkpoint " + path + ": checksum mismatch");
  WriteFile(path, bytes.substr(0, 100));
  ExpectDataLoss(ReadCheckpoint(path), "checkpoint " + path + ": truncated: 100 of ");
}

TEST(SealedBlob, RoundTripsAnyBytes) {
  const std::string payload(
      "state\0with\xff"
      "bytes",
      16);
  Result<std::string> back = UnsealBlob(SealBlob(payload), "rank 0");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, payload);
  Result<std::string> empty = UnsealBlob(SealBlob(""), "rank 0");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "");
}

TEST(SealedBlob, EverySingleByteFlipAndTruncationIsDataLossNamingTheSource) {
  const std::string sealed = SealBlob("the payload of a training state");
  for (size_t i = 0; i < sealed.size(); ++i) {
    std::string bad = sealed;
    bad[i] ^= 0x10;
    ExpectDataLoss(UnsealBlob(bad, "rank 2"), "rank 2: ");
    ExpectDataLoss(UnsealBlob(sealed.substr(0, i), "rank 2"), "rank 2: ");
  }
  ExpectDataLoss(UnsealBlob(SerializeState(SampleState()), "rank 2"), "rank 2: not a VirtualFlow");
}

TEST(SealedBlob, FileRoundTripsAndATamperedFileIsDataLoss) {
  TempDir dir;
  const std::string path = dir.File("torch/job.ckpt");
  ASSERT_TRUE(WriteSealedFile(path, "weights").ok());
  Result<std::string> back = ReadSealedFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, "weights");
  std::string bytes = ReadFile(path);
  bytes[bytes.size() - 1] ^= 0x01;
  WriteFile(path, bytes);
  ExpectDataLoss(ReadSealedFile(path), "checkpoint " + path + ": checksum mismatch");
  EXPECT_EQ(ReadSealedFile(dir.File("missing")).status().code(), StatusCode::kNotFound);
}

// WriteSealedFile writes the header, the payload and the digest without sealing a copy of the
// payload first: the file is SealBlob's bytes all the same, for any size of payload.
TEST(SealedBlob, AFileHoldsExactlySealBlobsBytes) {
  TempDir dir;
  const std::string path = dir.File("job.ckpt");
  for (size_t size : {size_t{0}, size_t{1}, size_t{63}, size_t{64}, size_t{1} << 20}) {
    std::string payload(size, '\0');
    for (size_t i = 0; i < size; ++i) payload[i] = static_cast<char>((i * 131 + size) & 0xff);
    ASSERT_TRUE(WriteSealedFile(path, payload).ok());
    EXPECT_EQ(ReadFile(path), SealBlob(payload)) << size;
  }
}

// A payload given as pieces (a PyTorch state: its header and each tensor's bytes where they lie)
// is sealed and written as the same bytes as the pieces joined: empty pieces, and pieces that
// end inside or across the 1 MiB the writer hashes at a time, included.
TEST(SealedBlob, PiecesAreSealedAndWrittenAsTheirJoinedBytes) {
  TempDir dir;
  const std::string path = dir.File("job.ckpt");
  const std::vector<size_t> sizes = {0, 5, (size_t{1} << 20) + 3, 0, (size_t{3} << 20) - 7, 64};
  std::vector<std::string> storage;
  for (size_t n = 0; n < sizes.size(); ++n) {
    std::string piece(sizes[n], '\0');
    for (size_t i = 0; i < piece.size(); ++i) piece[i] = static_cast<char>((i * 7 + n) & 0xff);
    storage.push_back(std::move(piece));
  }
  std::string joined;
  std::vector<std::string_view> pieces;
  for (const std::string& piece : storage) {
    joined += piece;
    pieces.emplace_back(piece);
  }
  EXPECT_EQ(SealBlob(pieces), SealBlob(joined));
  ASSERT_TRUE(WriteSealedFile(path, pieces).ok());
  EXPECT_EQ(ReadFile(path), SealBlob(joined));
  Result<std::string> back = ReadSealedFile(path);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, joined);
  EXPECT_EQ(SealBlob(std::span<const std::string_view>{}), SealBlob(""));
}

TEST(Sha256Hex, MatchesKnownAnswers) {
  EXPECT_EQ(Sha256Hex("abc", 3),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(Sha256Hex("", 0), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  const std::string two_blocks = "abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
  EXPECT_EQ(Sha256Hex(two_blocks.data(), two_blocks.size()),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

}  // namespace
}  // namespace vf
