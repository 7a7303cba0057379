// bundle_reader: format v1 (docs/format.md).
#include "bundle/reader.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>
#include <openssl/evp.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <map>

#include "checks.h"

namespace bundle {

namespace {

constexpr std::uint8_t kMagic[8] = {0x89, 'T', 'R', 'T', 'B', 'D', 'L', '\n'};
constexpr std::uint64_t kMaxManifest = 1ull << 20;   // docs/format.md, "Limits"
constexpr std::size_t kChunk = 1u << 20;

std::uint16_t le16(const std::uint8_t* p) { return static_cast<std::uint16_t>(p[0] | (p[1] << 8)); }
std::uint32_t le32(const std::uint8_t* p) {
    return static_cast<std::uint32_t>(p[0]) | static_cast<std::uint32_t>(p[1]) << 8 |
           static_cast<std::uint32_t>(p[2]) << 16 | static_cast<std::uint32_t>(p[3]) << 24;
}
std::uint64_t le64(const std::uint8_t* p) {
    return static_cast<std::uint64_t>(le32(p)) | static_cast<std::uint64_t>(le32(p + 4)) << 32;
}

std::string hex(const std::uint8_t* p, std::size_t n) {
    static const char* digits = "0123456789abcdef";
    std::string s(n * 2, '0');
    for (std::size_t i = 0; i < n; ++i) {
        s[2 * i] = digits[p[i] >> 4];
        s[2 * i + 1] = digits[p[i] & 15];
    }
    return s;
}

class Sha256 {
public:
    Sha256() : ctx_(EVP_MD_CTX_new()) {
        if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1) {
            EVP_MD_CTX_free(ctx_);
            throw BundleError("OpenSSL: cannot initialise SHA-256");
        }
    }
    ~Sha256() { EVP_MD_CTX_free(ctx_); }
    Sha256(const Sha256&) = delete;
    Sha256& operator=(const Sha256&) = delete;
    void update(const void* p, std::size_t n) {
        if (n && EVP_DigestUpdate(ctx_, p, n) != 1) throw BundleError("OpenSSL: SHA-256 update failed");
    }
    std::array<std::uint8_t, 32> digest() {
        std::array<std::uint8_t, 32> out{};
        unsigned int len = 0;
        if (EVP_DigestFinal_ex(ctx_, out.data(), &len) != 1 || len != 32)
            throw BundleError("OpenSSL: SHA-256 final failed");
        return out;
    }
private:
    EVP_MD_CTX* ctx_;
};

struct DStream {
    DStream() : ds(ZSTD_createDStream()) {
        if (!ds) throw DecompressionError("zstd: cannot allocate a decompression stream");
    }
    ~DStream() { ZSTD_freeDStream(ds); }
    DStream(const DStream&) = delete;
    DStream& operator=(const DStream&) = delete;
    ZSTD_DStream* ds;
};

unsigned ceil_log2(std::uint64_t v) {
    unsigned l = 0;
    while (l < 63 && (1ull << l) < v) ++l;
    return l;
}

// Decompresses one member, never producing more than raw_size bytes, feeding `sink`.
// Returns the sha256 of the output.
std::array<std::uint8_t, 32> inflate(const MemberEntry& m, const std::uint8_t* src, std::size_t n,
                                     const std::function<void(const std::uint8_t*, std::size_t)>& sink) {
    const std::string who = "member " + m.name + ": ";
    static const std::uint8_t kZstdMagic[4] = {0x28, 0xb5, 0x2f, 0xfd};
    if (n < 4 || std::memcmp(src, kZstdMagic, 4) != 0)
        throw DecompressionError(who + "stored bytes are not a zstd frame (skippable frames are not allowed)");
    unsigned long long fcs = ZSTD_getFrameContentSize(src, n);
    if (fcs == ZSTD_CONTENTSIZE_ERROR)
        throw DecompressionError(who + "stored bytes are not a zstd frame");
    if (fcs == ZSTD_CONTENTSIZE_UNKNOWN)
        throw DecompressionError(who + "zstd frame does not record its content size");
    if (fcs != m.raw_size)
        throw DecompressionError(who + "zstd frame content size " + std::to_string(fcs) +
                                 " differs from raw_size " + std::to_string(m.raw_size));
    std::size_t frame = ZSTD_findFrameCompressedSize(src, n);
    if (ZSTD_isError(frame))
        throw DecompressionError(who + "corrupt zstd data: " + ZSTD_getErrorName(frame));
    if (frame != n)
        throw DecompressionError(who + "stored bytes are not exactly one zstd frame");

    DStream d;
    // Window memory: the default limit (2^27), raised only as far as the declared raw size needs.
    unsigned wlog = std::max(27u, std::min(31u, ceil_log2(m.raw_size)));
    std::size_t r = ZSTD_DCtx_setParameter(d.ds, ZSTD_d_windowLogMax, static_cast<int>(wlog));
    if (ZSTD_isError(r)) throw DecompressionError(who + "zstd: " + ZSTD_getErrorName(r));

    std::vector<std::uint8_t> buf(static_cast<std::size_t>(std::min<std::uint64_t>(kChunk, std::max<std::uint64_t>(m.raw_size, 1))));
    Sha256 sha;
    ZSTD_inBuffer in{src, n, 0};
    std::uint64_t produced = 0;
    for (;;) {
        const std::uint64_t room = m.raw_size - produced;
        const bool probe = room == 0;   // anything more would be past raw_size
        ZSTD_outBuffer out{buf.data(), probe ? 1 : static_cast<std::size_t>(std::min<std::uint64_t>(room, buf.size())), 0};
        const std::size_t in_before = in.pos;
        r = ZSTD_decompressStream(d.ds, &out, &in);
        if (ZSTD_isError(r)) throw DecompressionError(who + "corrupt zstd data: " + ZSTD_getErrorName(r));
        if (probe && out.pos > 0)
            throw DecompressionError(who + "decompressed output exceeds raw_size " + std::to_string(m.raw_size));
        sha.update(buf.data(), out.pos);
        if (sink) sink(buf.data(), out.pos);
        produced += out.pos;
        if (r == 0) break;   // frame complete
        if (out.pos == 0 && in.pos == in_before)
            throw DecompressionError(who + "zstd frame is truncated");
    }
    if (produced != m.raw_size)
        throw DecompressionError(who + "decompressed to " + std::to_string(produced) +
                                 " bytes, raw_size says " + std::to_string(m.raw_size));
    if (in.pos != n) throw DecompressionError(who + "trailing bytes after the zstd frame");
    auto digest = sha.digest();
    if (hex(digest.data(), digest.size()) != m.sha256)
        throw IntegrityError(who + "sha256 mismatch (manifest " + m.sha256 + ", content " +
                             hex(digest.data(), digest.size()) + ")");
    return digest;
}

std::string fmt_ratio(std::uint64_t raw, std::uint64_t stored) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.3f", static_cast<double>(raw) / static_cast<double>(stored));
    return buf;
}

TensorSpec tensor_of(const Value& t) {
    TensorSpec s;
    s.name = t.get("name")->as_str();
    s.dtype = t.get("dtype")->as_str();
    for (const Value& d : t.get("shape")->as_array())
        s.shape.push_back(d.is_str() ? TensorSpec::kBatch
                                     : static_cast<std::int64_t>(std::min<std::uint64_t>(d.as_uint(), INT64_MAX)));
    return s;
}

}  // namespace

// ---- CRC-32 (ISO-HDLC: reflected, poly 0xEDB88320, init/xorout 0xFFFFFFFF; zlib's crc32) ------
std::uint32_t crc32(const std::uint8_t* data, std::size_t size, std::uint32_t crc) {
    static const auto table = [] {
        std::array<std::uint32_t, 256> t{};
        for (std::uint32_t i = 0; i < 256; ++i) {
            std::uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            t[i] = c;
        }
        return t;
    }();
    crc = ~crc;
    for (std::size_t i = 0; i < size; ++i) crc = table[(crc ^ data[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

std::string sha256_hex(const std::uint8_t* data, std::size_t size) {
    Sha256 s;
    s.update(data, size);
    auto d = s.digest();
    return hex(d.data(), d.size());
}

Header parse_header(const std::uint8_t* p, std::size_t file_size) {
    if (file_size == 0) throw TruncatedError("empty file (a bundle starts with a 64-byte header)");
    if (file_size < kHeaderSize)
        throw TruncatedError("truncated: " + std::to_string(file_size) + " bytes, shorter than the 64-byte header");
    if (std::memcmp(p, kMagic, sizeof kMagic) != 0)
        throw BadMagicError("wrong magic: not a trt-bundle file");
    Header h;
    h.major = le16(p + 8);
    h.minor = le16(p + 10);
    h.crc32 = le32(p + 12);
    std::uint8_t copy[kHeaderSize];
    std::memcpy(copy, p, kHeaderSize);
    std::memset(copy + 12, 0, 4);
    std::uint32_t crc = crc32(copy, kHeaderSize);
    if (crc != h.crc32) {
        char buf[96];
        std::snprintf(buf, sizeof buf, "header CRC32 mismatch (stored %08x, computed %08x)", h.crc32, crc);
        throw HeaderCorruptError(buf);
    }
    if (h.major != kFormatMajor)
        throw UnsupportedVersionError("unsupported format major " + std::to_string(h.major) + "." +
                                      std::to_string(h.minor) + " (this reader reads major " +
                                      std::to_string(kFormatMajor) + ")");
    h.manifest_offset = le64(p + 16);
    h.manifest_length = le64(p + 24);
    std::memcpy(h.bundle_id.data(), p + 32, 32);
    if (h.manifest_offset < kHeaderSize)
        throw TruncatedError("manifest offset " + std::to_string(h.manifest_offset) + " is inside the header");
    if (h.manifest_length < 1 || h.manifest_length > kMaxManifest)
        throw TruncatedError("manifest length " + std::to_string(h.manifest_length) + " outside 1..1 MiB");
    // offset + length == size, written without overflow
    if (h.manifest_offset > file_size || h.manifest_length != file_size - h.manifest_offset) {
        bool past = h.manifest_offset > file_size || h.manifest_length > file_size - h.manifest_offset;
        throw TruncatedError(std::string(past ? "truncated: manifest [" : "trailing bytes: manifest [") +
                             std::to_string(h.manifest_offset) + ", +" + std::to_string(h.manifest_length) +
                             ") does not end at the end of the file (" + std::to_string(file_size) + " bytes)");
    }
    return h;
}

PreprocessSpec parse_preprocess(const Value& v) {
    detail::Problems p;
    detail::check_preprocess(v, p);
    if (!p.empty()) throw PreprocessError("preprocess.msgpack: " + p.joined());
    PreprocessSpec s;
    s.spec_version = 1;
    s.decode_mode = v.get("decode")->get("mode")->as_str();
    const Value& r = *v.get("resize");
    s.resize_size = static_cast<std::uint32_t>(r.get("size")->as_uint());
    s.resize_edge = r.get("edge")->as_str();
    s.interpolation = r.get("interpolation")->as_str();
    s.antialias = r.get("antialias")->as_bool();
    s.crop_height = static_cast<std::uint32_t>(v.get("center_crop")->get("height")->as_uint());
    s.crop_width = static_cast<std::uint32_t>(v.get("center_crop")->get("width")->as_uint());
    s.rescale_factor = v.get("rescale")->get("factor")->as_double();
    for (std::size_t i = 0; i < 3; ++i) {
        s.mean[i] = v.get("normalize")->get("mean")->as_array()[i].as_double();
        s.std[i] = v.get("normalize")->get("std")->as_array()[i].as_double();
    }
    s.layout = v.get("layout")->as_str();
    s.dtype = v.get("dtype")->as_str();
    s.input = v.get("input")->as_str();
    return s;
}

// ---- Bundle -------------------------------------------------------------------------------------
struct Bundle::Impl {
    std::string path;
    int fd = -1;
    const std::uint8_t* data = nullptr;
    std::uint64_t size = 0;
    Header header;
    Value manifest;
    std::vector<MemberEntry> members;   // sorted by offset
    OpenOptions options;

    ~Impl() {
        if (data) munmap(const_cast<std::uint8_t*>(data), static_cast<std::size_t>(size));
        if (fd >= 0) close(fd);
    }
};

Bundle::Bundle(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Bundle::Bundle(Bundle&&) noexcept = default;
Bundle& Bundle::operator=(Bundle&&) noexcept = default;
Bundle::~Bundle() = default;

Bundle Bundle::open(const std::string& path, const OpenOptions& options) {
    auto im = std::make_unique<Impl>();
    im->path = path;
    im->options = options;

    struct stat st{};
    if (::stat(path.c_str(), &st) != 0) {
        int e = errno;
        throw NotFoundError(e == ENOENT ? "no such file" : std::string("cannot stat: ") + std::strerror(e));
    }
    if (S_ISDIR(st.st_mode)) throw NotFoundError("is a directory, not a bundle file");
    if (!S_ISREG(st.st_mode)) throw NotFoundError("not a regular file");
    im->fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (im->fd < 0) throw NotFoundError(std::string("cannot open: ") + std::strerror(errno));
    if (::fstat(im->fd, &st) != 0 || !S_ISREG(st.st_mode))
        throw NotFoundError("not a regular file");
    if (st.st_size < 0) throw FormatError("negative file size");
    im->size = static_cast<std::uint64_t>(st.st_size);
    if (im->size < kHeaderSize) {   // no mapping needed to reject it; mmap of 0 bytes fails anyway
        std::uint8_t head[kHeaderSize] = {};
        parse_header(head, static_cast<std::size_t>(im->size));   // throws Truncated
    }
    if (im->size > SIZE_MAX) throw FormatError("file too large to map");
    void* m = mmap(nullptr, static_cast<std::size_t>(im->size), PROT_READ, MAP_PRIVATE, im->fd, 0);
    if (m == MAP_FAILED) throw BundleError(std::string("mmap failed: ") + std::strerror(errno));
    im->data = static_cast<const std::uint8_t*>(m);

    im->header = parse_header(im->data, static_cast<std::size_t>(im->size));
    const Header& h = im->header;
    const std::uint8_t* mbytes = im->data + h.manifest_offset;
    const std::size_t mlen = static_cast<std::size_t>(h.manifest_length);

    Sha256 sha;
    sha.update(mbytes, mlen);
    auto id = sha.digest();
    if (std::memcmp(id.data(), h.bundle_id.data(), 32) != 0)
        throw IntegrityError("manifest sha256 " + hex(id.data(), 32) + " is not the bundle id " +
                             hex(h.bundle_id.data(), 32) + " (manifest or header corrupt)");

    try {
        im->manifest = decode_msgpack(mbytes, mlen, /*canonical=*/true);
    } catch (const ManifestError& e) {
        throw ManifestError(std::string("manifest: ") + e.what());
    }
    if (!im->manifest.is_map()) throw ManifestError("manifest: top-level value is not a map");

    detail::Problems problems;
    const Value* fmt = im->manifest.get("format");
    std::uint64_t mminor = 0;
    if (fmt && fmt->is_map() && fmt->get("minor") && fmt->get("minor")->type() == Value::Type::UInt)
        mminor = fmt->get("minor")->as_uint();
    detail::check_manifest(im->manifest, /*strict_keys=*/mminor <= kFormatMinor, problems);
    if (!problems.empty()) throw ManifestError("manifest does not satisfy the schema: " + problems.joined());
    detail::check_semantics(im->manifest, problems);
    if (!problems.empty()) throw ManifestError("manifest breaks the rules of docs/format.md: " + problems.joined());
    if (fmt->get("major")->as_uint() != h.major || fmt->get("minor")->as_uint() != h.minor)
        throw ManifestError("manifest format " + std::to_string(fmt->get("major")->as_uint()) + "." +
                            std::to_string(fmt->get("minor")->as_uint()) + " differs from the header's " +
                            std::to_string(h.major) + "." + std::to_string(h.minor));
    if (h.minor > kFormatMinor && !options.allow_newer_minor)
        throw UnsupportedVersionError("format minor " + std::to_string(h.minor) + " is newer than this reader's");

    // Members: unique names, tiling [64, manifest_offset) exactly once sorted by offset.
    std::map<std::string, int> names;
    for (const Value& e : im->manifest.get("members")->as_array()) {
        MemberEntry me;
        me.name = e.get("name")->as_str();
        me.offset = e.get("offset")->as_uint();
        me.stored_size = e.get("stored_size")->as_uint();
        me.raw_size = e.get("raw_size")->as_uint();
        me.sha256 = e.get("sha256")->as_str();
        me.compression = e.get("compression")->as_str();
        if (names[me.name]++) throw MemberLayoutError("duplicate member name " + me.name);
        im->members.push_back(std::move(me));
    }
    std::sort(im->members.begin(), im->members.end(),
              [](const MemberEntry& a, const MemberEntry& b) { return a.offset < b.offset; });
    std::uint64_t expect = kHeaderSize;
    for (const MemberEntry& me : im->members) {
        if (me.offset >= h.manifest_offset || me.stored_size > h.manifest_offset - me.offset)
            throw MemberLayoutError("member " + me.name + " [" + std::to_string(me.offset) + ", +" +
                                    std::to_string(me.stored_size) + ") is outside the member area [64, " +
                                    std::to_string(h.manifest_offset) + ")");
        if (me.offset < expect)
            throw MemberLayoutError("member " + me.name + " at " + std::to_string(me.offset) +
                                    " overlaps the bytes before it (which end at " + std::to_string(expect) + ")");
        if (me.offset > expect)
            throw MemberLayoutError("gap of " + std::to_string(me.offset - expect) + " bytes before member " +
                                    me.name + " at " + std::to_string(me.offset));
        expect = me.offset + me.stored_size;   // cannot overflow: <= manifest_offset
    }
    if (expect != h.manifest_offset)
        throw MemberLayoutError("gap of " + std::to_string(h.manifest_offset - expect) +
                                " bytes between the last member and the manifest");
    const std::string& engine_member = im->manifest.get("engine")->get("member")->as_str();
    if (!names.count(engine_member))
        throw ManifestError("engine.member " + engine_member + " is not one of the bundle's members");
    return Bundle(std::move(im));
}

const std::string& Bundle::path() const { return impl_->path; }
std::uint64_t Bundle::file_size() const { return impl_->size; }
const Header& Bundle::header() const { return impl_->header; }
std::string Bundle::id() const { return hex(impl_->header.bundle_id.data(), 32); }
const Value& Bundle::manifest() const { return impl_->manifest; }
const std::vector<MemberEntry>& Bundle::members() const { return impl_->members; }

const MemberEntry* Bundle::find_member(const std::string& name) const {
    for (const auto& m : impl_->members)
        if (m.name == name) return &m;
    return nullptr;
}

std::vector<TensorSpec> Bundle::inputs() const {
    std::vector<TensorSpec> out;
    for (const Value& t : impl_->manifest.get("inputs")->as_array()) out.push_back(tensor_of(t));
    return out;
}

std::vector<TensorSpec> Bundle::outputs() const {
    std::vector<TensorSpec> out;
    for (const Value& t : impl_->manifest.get("outputs")->as_array()) out.push_back(tensor_of(t));
    return out;
}

BatchRange Bundle::batch() const {
    const Value& b = *impl_->manifest.get("batch");
    return {b.get("min")->as_uint(), b.get("opt")->as_uint(), b.get("max")->as_uint()};
}

EngineTarget Bundle::engine() const {
    const Value& e = *impl_->manifest.get("engine");
    return {e.get("backend")->as_str(), e.get("member")->as_str(), *e.get("details")};
}

bool Bundle::random_weights() const {
    const Value* kind = impl_->manifest.get("source")->get("kind");
    return kind && kind->is_str() && kind->as_str() == "random-weights";
}

std::pair<const std::uint8_t*, std::size_t> Bundle::stored_bytes(const MemberEntry& m) const {
    // open() proved offset + stored_size <= manifest_offset <= file size
    return {impl_->data + m.offset, static_cast<std::size_t>(m.stored_size)};
}

void Bundle::verify() const {
    for (const MemberEntry& m : impl_->members) {
        auto s = stored_bytes(m);
        inflate(m, s.first, s.second, nullptr);
    }
}

std::vector<std::uint8_t> Bundle::member(const std::string& name) const {
    const MemberEntry* m = find_member(name);
    if (!m) throw MemberNotFoundError("no member named " + name);
    if (m->raw_size > impl_->options.max_member_bytes || m->raw_size > SIZE_MAX)
        throw DecompressionError("member " + name + ": raw_size " + std::to_string(m->raw_size) +
                                 " exceeds the reader's limit");
    // Exactly raw_size bytes, allocated once (never grown by doubling): inflate() checked that the
    // frame's content size is raw_size and stops at any output past it.
    std::vector<std::uint8_t> out(static_cast<std::size_t>(m->raw_size));
    std::size_t filled = 0;
    auto s = stored_bytes(*m);
    inflate(*m, s.first, s.second, [&out, &filled](const std::uint8_t* p, std::size_t n) {
        if (n == 0) return;   // raw_size 0: out.data() may be null
        std::memcpy(out.data() + filled, p, n);   // inflate never hands more than raw_size in all
        filled += n;
    });
    return out;
}

std::optional<PreprocessSpec> Bundle::preprocess() const {
    if (!find_member("preprocess.msgpack")) return std::nullopt;
    std::vector<std::uint8_t> raw = member("preprocess.msgpack");
    Value v;
    try {
        v = decode_msgpack(raw.data(), raw.size(), /*canonical=*/false);
    } catch (const ManifestError& e) {
        throw PreprocessError(std::string("preprocess.msgpack: ") + e.what());
    }
    return parse_preprocess(v);
}

std::string Bundle::inspect_json() const {
    Value::Map top = impl_->manifest.as_map();
    for (auto& kv : top) {
        if (kv.first != "members") continue;
        Value::Array entries;
        for (const Value& e : kv.second.as_array()) {
            Value::Map em = e.as_map();
            em.emplace_back("ratio", Value::str(fmt_ratio(e.get("raw_size")->as_uint(), e.get("stored_size")->as_uint())));
            entries.push_back(Value::map(std::move(em)));
        }
        kv.second = Value::array(std::move(entries));
    }
    top.erase(std::remove_if(top.begin(), top.end(), [](const auto& kv) {
                  return kv.first == "id" || kv.first == "path" || kv.first == "file_size" ||
                         kv.first == "random_weights";
              }), top.end());
    top.emplace_back("id", Value::str(id()));
    top.emplace_back("path", Value::str(impl_->path));
    top.emplace_back("file_size", Value::uint(impl_->size));
    top.emplace_back("random_weights", Value::boolean(random_weights()));
    return to_json(Value::map(std::move(top)));
}

}  // namespace bundle
