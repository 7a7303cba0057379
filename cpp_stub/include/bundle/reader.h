// bundle_reader: reads and verifies a trt-bundle file (format v1, docs/format.md).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "bundle/value.h"

namespace bundle {

// ---- errors: one class per kind of rejection, all derive from BundleError -------------------
struct BundleError : std::runtime_error { using std::runtime_error::runtime_error; };
struct NotFoundError : BundleError { using BundleError::BundleError; };        // missing / not a file
struct FormatError : BundleError { using BundleError::BundleError; };
struct TruncatedError : FormatError { using FormatError::FormatError; };       // empty / short / bounds
struct BadMagicError : FormatError { using FormatError::FormatError; };
struct UnsupportedVersionError : FormatError { using FormatError::FormatError; };
struct HeaderCorruptError : FormatError { using FormatError::FormatError; };   // CRC
struct MemberLayoutError : FormatError { using FormatError::FormatError; };    // tiling, dupes
struct ManifestError : BundleError { using BundleError::BundleError; };        // decode/canonical/schema
struct IntegrityError : BundleError { using BundleError::BundleError; };       // id / sha256 mismatch
struct DecompressionError : BundleError { using BundleError::BundleError; };   // zstd, sizes
struct MemberNotFoundError : BundleError { using BundleError::BundleError; };
struct PreprocessError : BundleError { using BundleError::BundleError; };
struct CompatibilityError : BundleError { using BundleError::BundleError; };

// ---- what the manifest says -------------------------------------------------------------------
constexpr std::uint16_t kFormatMajor = 1;
constexpr std::uint16_t kFormatMinor = 0;   // newest minor this reader knows
constexpr std::size_t kHeaderSize = 64;

struct Header {
    std::uint16_t major = 0, minor = 0;
    std::uint32_t crc32 = 0;
    std::uint64_t manifest_offset = 0, manifest_length = 0;
    std::array<std::uint8_t, 32> bundle_id{};
};

struct MemberEntry {
    std::string name;
    std::uint64_t offset = 0, stored_size = 0, raw_size = 0;
    std::string sha256;        // lower-case hex of the decompressed bytes
    std::string compression;   // "zstd"
};

struct TensorSpec {
    static constexpr std::int64_t kBatch = -1;   // the "batch" (dynamic) axis
    std::string name, dtype;                     // dtype: numpy name, e.g. "float32"
    std::vector<std::int64_t> shape;
};

struct BatchRange { std::uint64_t min = 0, opt = 0, max = 0; };

struct EngineTarget {
    std::string backend;   // onnxruntime | tensorrt | torch-aoti
    std::string member;    // model.onnx | engine.plan | engine.pt2
    Value details;         // per backend (docs/format.md, engine.details)
};

// preprocess.msgpack, schemas/preprocess.schema.json (spec_version 1).
struct PreprocessSpec {
    int spec_version = 1;
    std::string decode_mode;          // "RGB"
    std::uint32_t resize_size = 0;    // shorter edge after resize
    std::string resize_edge;          // "shorter"
    std::string interpolation;        // bicubic | bilinear | nearest | lanczos
    bool antialias = false;
    std::uint32_t crop_height = 0, crop_width = 0;
    double rescale_factor = 0.0;      // e.g. 1/255
    std::array<double, 3> mean{}, std{};
    std::string layout;               // "NCHW"
    std::string dtype;                // "float32"
    std::string input;                // model input fed by this tensor
};

struct OpenOptions {
    bool allow_newer_minor = true;             // a major-1 reader reads any minor (format.md)
    std::uint64_t max_member_bytes = 1ull << 36;  // refuse to materialize larger members (64 GiB)
};

// ---- the bundle ---------------------------------------------------------------------------------
class Bundle {
public:
    // Maps the file and checks, in order: size, magic, CRC, major, manifest bounds, manifest id,
    // manifest decoding (limits, canonical form), schema, member layout. Member contents are not
    // read: call verify() (or member(), which verifies the one it returns).
    static Bundle open(const std::string& path, const OpenOptions& options = {});

    Bundle(Bundle&&) noexcept;
    Bundle& operator=(Bundle&&) noexcept;
    ~Bundle();

    const std::string& path() const;
    std::uint64_t file_size() const;
    const Header& header() const;
    std::string id() const;                       // lower-case hex sha256 of the manifest bytes
    const Value& manifest() const;                // the whole manifest, as decoded
    const std::vector<MemberEntry>& members() const;  // in file order
    const MemberEntry* find_member(const std::string& name) const;

    std::vector<TensorSpec> inputs() const;
    std::vector<TensorSpec> outputs() const;
    BatchRange batch() const;
    EngineTarget engine() const;
    bool random_weights() const;                  // source.kind == "random-weights"

    // Decompresses (bounded by raw_size) and checks the sha256 of every member.
    void verify() const;
    // One member's decompressed bytes, sha256-checked. Throws MemberNotFoundError.
    std::vector<std::uint8_t> member(const std::string& name) const;
    // The stored (compressed) bytes of a member, a view into the mapping.
    std::pair<const std::uint8_t*, std::size_t> stored_bytes(const MemberEntry& m) const;
    // preprocess.msgpack decoded and validated; nullopt when the bundle has no such member.
    std::optional<PreprocessSpec> preprocess() const;

    // What `bundle inspect --json` prints (see docs): manifest + id, path, file_size,
    // random_weights, members[].ratio.
    std::string inspect_json() const;

private:
    struct Impl;
    explicit Bundle(std::unique_ptr<Impl> impl);
    std::unique_ptr<Impl> impl_;
};

// ---- helpers, exposed for tests and other tools -------------------------------------------------
std::uint32_t crc32(const std::uint8_t* data, std::size_t size, std::uint32_t crc = 0);
std::string sha256_hex(const std::uint8_t* data, std::size_t size);
Header parse_header(const std::uint8_t* data, std::size_t file_size);   // the header checks only
PreprocessSpec parse_preprocess(const Value& v);                         // throws PreprocessError

// The same checks as the Python runtime (runtime_py.compat) before deserializing a TensorRT plan:
// TensorRT major.minor must equal details.tensorrt_version unless details.version_compatible
// (then the same major and not older, or 10 -> 11); the GPU compute capability must equal
// details.compute_capability unless hardware_compatibility is "ampere+" (then >= 8.0).
// Throws CompatibilityError naming each mismatch.
void check_tensorrt_compatibility(const EngineTarget& engine, const std::string& runtime_trt_version,
                                  const std::string& device_compute_capability);

}  // namespace bundle
