// Bounded msgpack decoding on top of msgpuck's primitives.
//
// msgpuck's decoders trust their input, so every call below is preceded by a check that the
// bytes it reads are inside [cur, end): the header through mp_check_<type>() (which only looks at
// the header), payload lengths against the bytes left. mp_check() (whole-value validation) is not
// used: it counts elements in a signed int that hostile counts overflow. Declared container
// counts are never used to allocate before checking them against the bytes left (each element
// takes at least one byte) and the limits.
#include <msgpuck.h>

#include <cmath>
#include <cstring>
#include <set>
#include <string>

#include "bundle/reader.h"
#include "bundle/value.h"

namespace bundle {

double Value::as_double() const {
    switch (type_) {
        case Type::UInt: return static_cast<double>(u_);
        case Type::Int: return static_cast<double>(i_);
        case Type::Float: return d_;
        default: return 0.0;
    }
}

const Value* Value::get(const std::string& key) const {
    if (type_ != Type::Map) return nullptr;
    for (const auto& kv : m_)
        if (kv.first == key) return &kv.second;
    return nullptr;
}

namespace {

bool valid_utf8(const unsigned char* s, std::size_t n) {
    std::size_t i = 0;
    while (i < n) {
        unsigned char c = s[i];
        if (c < 0x80) { ++i; continue; }
        std::size_t len;
        std::uint32_t cp;
        if ((c & 0xE0) == 0xC0) { len = 2; cp = c & 0x1F; }
        else if ((c & 0xF0) == 0xE0) { len = 3; cp = c & 0x0F; }
        else if ((c & 0xF8) == 0xF0) { len = 4; cp = c & 0x07; }
        else return false;
        if (n - i < len) return false;
        for (std::size_t k = 1; k < len; ++k) {
            if ((s[i + k] & 0xC0) != 0x80) return false;
            cp = (cp << 6) | (s[i + k] & 0x3F);
        }
        if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000))
            return false;                                   // overlong
        if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
        i += len;
    }
    return true;
}

class Decoder {
public:
    Decoder(const std::uint8_t* data, std::size_t size, bool canonical, const DecodeLimits& lim)
        : begin_(reinterpret_cast<const char*>(data)), cur_(begin_), end_(begin_ + size),
          canonical_(canonical), lim_(lim) {}

    Value document() {
        if (cur_ == end_) fail("empty");
        Value v = value(1);
        if (cur_ != end_) fail("trailing bytes after the top-level value");
        return v;
    }

private:
    [[noreturn]] void fail(const std::string& what) const {
        throw ManifestError("msgpack: " + what + " (at byte " + std::to_string(cur_ - begin_) + ")");
    }
    std::size_t left() const { return static_cast<std::size_t>(end_ - cur_); }
    void need_header(std::ptrdiff_t missing) const {
        if (missing > 0) fail("truncated value");
    }
    void noncanonical(const char* what) const {
        fail(std::string("non-canonical encoding: ") + what);
    }

    std::string str_payload(std::uint32_t len) {
        if (len > lim_.max_str) fail("string longer than " + std::to_string(lim_.max_str) + " bytes");
        if (len > left()) fail("truncated string");
        const auto* p = reinterpret_cast<const unsigned char*>(cur_);
        if (!valid_utf8(p, len)) fail("string is not valid UTF-8");
        std::string s(cur_, len);
        cur_ += len;
        return s;
    }

    std::string key() {
        if (cur_ >= end_) fail("truncated map");
        if (mp_typeof(*cur_) != MP_STR || static_cast<unsigned char>(*cur_) == 0xc1)
            fail("map key is not a string");
        const char* start = cur_;
        need_header(mp_check_strl(cur_, end_));
        std::uint32_t len = mp_decode_strl(&cur_);
        if (canonical_ && static_cast<std::size_t>(cur_ - start) != mp_sizeof_strl(len))
            noncanonical("string length not in its shortest form");
        return str_payload(len);
    }

    // `depth`: the depth this value has if it is a container (scalars add no depth).
    Value value(std::size_t depth) {
        if (++nodes_ > lim_.max_nodes) fail("more than " + std::to_string(lim_.max_nodes) + " values");
        if (cur_ >= end_) fail("truncated value");
        const unsigned char tag = static_cast<unsigned char>(*cur_);
        if (tag == 0xc1) fail("reserved type byte 0xc1");
        const char* start = cur_;
        switch (mp_typeof(*cur_)) {
            case MP_NIL:
                mp_decode_nil(&cur_);
                return Value::nil();
            case MP_BOOL:
                return Value::boolean(mp_decode_bool(&cur_));
            case MP_UINT: {
                need_header(mp_check_uint(cur_, end_));
                std::uint64_t u = mp_decode_uint(&cur_);
                if (canonical_ && static_cast<std::size_t>(cur_ - start) != mp_sizeof_uint(u))
                    noncanonical("integer not in its shortest form");
                return Value::uint(u);
            }
            case MP_INT: {
                need_header(mp_check_int(cur_, end_));
                std::int64_t i = mp_decode_int(&cur_);
                if (i >= 0) {
                    if (canonical_) noncanonical("non-negative integer in a signed type");
                    return Value::uint(static_cast<std::uint64_t>(i));
                }
                if (canonical_ && static_cast<std::size_t>(cur_ - start) != mp_sizeof_int(i))
                    noncanonical("integer not in its shortest form");
                return Value::sint(i);
            }
            case MP_FLOAT:
            case MP_DOUBLE: {
                if (canonical_) fail("float in the manifest (measured numbers are decimal strings)");
                bool single = mp_typeof(*cur_) == MP_FLOAT;
                need_header(single ? mp_check_float(cur_, end_) : mp_check_double(cur_, end_));
                double d = single ? mp_decode_float(&cur_) : mp_decode_double(&cur_);
                return Value::real(d);
            }
            case MP_STR: {
                need_header(mp_check_strl(cur_, end_));
                std::uint32_t len = mp_decode_strl(&cur_);
                if (canonical_ && static_cast<std::size_t>(cur_ - start) != mp_sizeof_strl(len))
                    noncanonical("string length not in its shortest form");
                return Value::str(str_payload(len));
            }
            case MP_ARRAY: {
                if (depth > lim_.max_depth) fail("nesting deeper than " + std::to_string(lim_.max_depth));
                need_header(mp_check_array(cur_, end_));
                std::uint32_t n = mp_decode_array(&cur_);
                if (canonical_ && static_cast<std::size_t>(cur_ - start) != mp_sizeof_array(n))
                    noncanonical("array length not in its shortest form");
                if (n > lim_.max_container) fail("array of more than " + std::to_string(lim_.max_container) + " entries");
                if (n > left()) fail("truncated array");
                Value::Array a;
                a.reserve(n);
                for (std::uint32_t k = 0; k < n; ++k) a.push_back(value(depth + 1));
                return Value::array(std::move(a));
            }
            case MP_MAP: {
                if (depth > lim_.max_depth) fail("nesting deeper than " + std::to_string(lim_.max_depth));
                need_header(mp_check_map(cur_, end_));
                std::uint32_t n = mp_decode_map(&cur_);
                if (canonical_ && static_cast<std::size_t>(cur_ - start) != mp_sizeof_map(n))
                    noncanonical("map length not in its shortest form");
                if (n > lim_.max_container) fail("map of more than " + std::to_string(lim_.max_container) + " entries");
                if (n > left() / 2) fail("truncated map");
                Value::Map m;
                m.reserve(n);
                std::set<std::string> seen;
                for (std::uint32_t k = 0; k < n; ++k) {
                    std::string name = key();
                    if (canonical_) {
                        if (!m.empty() && !(m.back().first < name)) {
                            if (m.back().first == name) fail("duplicate map key \"" + name + "\"");
                            noncanonical(("map keys not sorted (\"" + name + "\" after \"" + m.back().first + "\")").c_str());
                        }
                    } else if (!seen.insert(name).second) {
                        fail("duplicate map key \"" + name + "\"");
                    }
                    Value v = value(depth + 1);
                    m.emplace_back(std::move(name), std::move(v));
                }
                return Value::map(std::move(m));
            }
            case MP_BIN:
                fail(canonical_ ? "bin value in the manifest" : "bin value");
            case MP_EXT:
            default:
                fail(canonical_ ? "ext value in the manifest" : "ext value");
        }
    }

    const char* begin_;
    const char* cur_;
    const char* end_;
    bool canonical_;
    DecodeLimits lim_;
    std::size_t nodes_ = 0;
};

}  // namespace

Value decode_msgpack(const std::uint8_t* data, std::size_t size, bool canonical,
                     const DecodeLimits& limits) {
    return Decoder(data, size, canonical, limits).document();
}

}  // namespace bundle
