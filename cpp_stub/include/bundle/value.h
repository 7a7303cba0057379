// A decoded msgpack value: the generic tree behind the manifest and `engine.details`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace bundle {

class Value {
public:
    enum class Type { Nil, Bool, UInt, Int, Float, Str, Array, Map };
    using Array = std::vector<Value>;
    using Map = std::vector<std::pair<std::string, Value>>;  // keys in file order (sorted in a manifest)

    Value() = default;
    static Value nil() { return Value(); }
    static Value boolean(bool b) { Value v; v.type_ = Type::Bool; v.b_ = b; return v; }
    static Value uint(std::uint64_t u) { Value v; v.type_ = Type::UInt; v.u_ = u; return v; }
    static Value sint(std::int64_t i) { Value v; v.type_ = Type::Int; v.i_ = i; return v; }  // negative ints
    static Value real(double d) { Value v; v.type_ = Type::Float; v.d_ = d; return v; }
    static Value str(std::string s) { Value v; v.type_ = Type::Str; v.s_ = std::move(s); return v; }
    static Value array(Array a) { Value v; v.type_ = Type::Array; v.a_ = std::move(a); return v; }
    static Value map(Map m) { Value v; v.type_ = Type::Map; v.m_ = std::move(m); return v; }

    Type type() const { return type_; }
    bool is_nil() const { return type_ == Type::Nil; }
    bool is_bool() const { return type_ == Type::Bool; }
    bool is_int() const { return type_ == Type::UInt || type_ == Type::Int; }
    bool is_number() const { return is_int() || type_ == Type::Float; }
    bool is_str() const { return type_ == Type::Str; }
    bool is_array() const { return type_ == Type::Array; }
    bool is_map() const { return type_ == Type::Map; }

    bool as_bool() const { return b_; }
    std::uint64_t as_uint() const { return u_; }   // valid when type() == UInt
    std::int64_t as_int() const { return i_; }     // valid when type() == Int (always < 0)
    double as_double() const;                      // any number
    const std::string& as_str() const { return s_; }
    const Array& as_array() const { return a_; }
    const Map& as_map() const { return m_; }

    // Map lookup: nullptr when not a map or the key is absent.
    const Value* get(const std::string& key) const;

private:
    Type type_ = Type::Nil;
    bool b_ = false;
    std::uint64_t u_ = 0;
    std::int64_t i_ = 0;
    double d_ = 0.0;
    std::string s_;
    Array a_;
    Map m_;
};

// docs/format.md, "Limits" (runtime_py/format/manifest.py has the same numbers).
struct DecodeLimits {
    std::size_t max_str = 1u << 16;        // UTF-8 bytes per string (keys too)
    std::size_t max_container = 1u << 16; // entries per array / map
    std::size_t max_depth = 64;            // containers: the top-level one is depth 1
    std::size_t max_nodes = 1u << 16;      // values in the whole document (map keys not counted)
};

// Decodes exactly one msgpack value spanning all of [data, data+size).
// canonical=true: the manifest rules of docs/format.md (string keys sorted by bytes, strictly,
// no float/bin/ext, shortest encodings). canonical=false: floats allowed, keys must be strings,
// no duplicate keys. Throws ManifestError (what names the problem and where).
Value decode_msgpack(const std::uint8_t* data, std::size_t size, bool canonical,
                     const DecodeLimits& limits = {});

// JSON text of a value (keys sorted, strings escaped; floats with 17 significant digits).
std::string to_json(const Value& v);

}  // namespace bundle
