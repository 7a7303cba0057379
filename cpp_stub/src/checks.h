// Internal: schema checks of the manifest and of preprocess.msgpack (hand-written from
// schemas/manifest.schema.json and schemas/preprocess.schema.json), collecting every problem.
#pragma once

#include <string>
#include <vector>

#include "bundle/value.h"

namespace bundle {
namespace detail {

class Problems {
public:
    void add(std::string p) { items_.push_back(std::move(p)); }
    bool empty() const { return items_.empty(); }
    std::string joined() const;   // "a; b; c" (at most 20, then "and N more")
private:
    std::vector<std::string> items_;
};

// Pattern helpers (no std::regex: hostile strings must not recurse).
bool is_member_name(const std::string& s);   // ^[a-z0-9][a-z0-9_-]{0,62}(\.[a-z0-9]{1,16})?$
bool is_ident(const std::string& s);         // ^[a-z0-9][a-z0-9_.-]{0,63}$
bool is_bundle_name(const std::string& s);   // ^[A-Za-z0-9_.+-]{1,200}$
bool is_hex64(const std::string& s);         // ^[0-9a-f]{64}$
bool is_prefixed_sha256(const std::string& s);  // ^sha256:[0-9a-f]{64}$
bool is_decimal(const std::string& s);       // ^-?(inf|nan|[0-9]+(\.[0-9]+)?(e[-+]?[0-9]+)?)$
bool is_dotted_pair(const std::string& s);   // ^[0-9]+\.[0-9]+$
// Characters (code points) of a valid UTF-8 string: JSON Schema's minLength/maxLength unit.
std::size_t utf8_length(const std::string& s);

// Checks the manifest against the schema; `strict_keys` refuses unknown keys
// (additionalProperties: false), used when the file's minor is one this reader knows.
void check_manifest(const Value& m, bool strict_keys, Problems& p);
// The rules beyond the schema (docs/format.md; runtime_py/format/semantics.py). Run only on a
// manifest that check_manifest accepted.
void check_semantics(const Value& m, Problems& p);
// The most bytes member `name` may declare (docs/format.md, "Member size limits"); 0: no limit.
std::uint64_t member_raw_size_limit(const std::string& name, const std::string& engine_member);
void check_preprocess(const Value& v, Problems& p);

}  // namespace detail
}  // namespace bundle
