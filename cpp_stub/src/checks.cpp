#include "checks.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <vector>

namespace bundle {
namespace detail {

std::string Problems::joined() const {
    std::string out;
    std::size_t shown = 0;
    for (const auto& s : items_) {
        if (shown == 20) {
            out += "; and " + std::to_string(items_.size() - shown) + " more";
            break;
        }
        if (shown++) out += "; ";
        out += s;
    }
    return out;
}

namespace {
bool lower_digit(char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); }
bool digit(char c) { return c >= '0' && c <= '9'; }
bool hex(char c) { return digit(c) || (c >= 'a' && c <= 'f'); }
std::size_t digits_from(const std::string& s, std::size_t i) {
    std::size_t j = i;
    while (j < s.size() && digit(s[j])) ++j;
    return j - i;
}
}  // namespace

std::size_t utf8_length(const std::string& s) {
    std::size_t n = 0;
    for (char c : s)
        if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;   // count lead bytes
    return n;
}

bool is_member_name(const std::string& s) {
    if (s.empty() || !lower_digit(s[0])) return false;
    std::size_t i = 1;
    while (i < s.size() && (lower_digit(s[i]) || s[i] == '_' || s[i] == '-')) ++i;
    if (i > 63) return false;
    if (i == s.size()) return true;
    if (s[i] != '.') return false;
    std::size_t ext = s.size() - i - 1;
    if (ext < 1 || ext > 16) return false;
    for (std::size_t k = i + 1; k < s.size(); ++k)
        if (!lower_digit(s[k])) return false;
    return true;
}

bool is_ident(const std::string& s) {
    if (s.empty() || s.size() > 64 || !lower_digit(s[0])) return false;
    for (char c : s)
        if (!(lower_digit(c) || c == '_' || c == '.' || c == '-')) return false;
    return true;
}

bool is_bundle_name(const std::string& s) {
    if (s.empty() || s.size() > 200) return false;
    for (char c : s)
        if (!((c >= 'A' && c <= 'Z') || lower_digit(c) || c == '_' || c == '.' || c == '+' || c == '-'))
            return false;
    return true;
}

bool is_hex64(const std::string& s) {
    if (s.size() != 64) return false;
    for (char c : s)
        if (!hex(c)) return false;
    return true;
}

bool is_prefixed_sha256(const std::string& s) {
    return s.size() == 71 && s.compare(0, 7, "sha256:") == 0 && is_hex64(s.substr(7));
}

bool is_decimal(const std::string& s) {
    std::size_t i = 0;
    if (i < s.size() && s[i] == '-') ++i;
    std::string rest = s.substr(i);
    if (rest == "inf" || rest == "nan") return true;
    std::size_t n = digits_from(s, i);
    if (n == 0) return false;
    i += n;
    if (i < s.size() && s[i] == '.') {
        n = digits_from(s, i + 1);
        if (n == 0) return false;
        i += 1 + n;
    }
    if (i < s.size() && s[i] == 'e') {
        ++i;
        if (i < s.size() && (s[i] == '-' || s[i] == '+')) ++i;
        n = digits_from(s, i);
        if (n == 0) return false;
        i += n;
    }
    return i == s.size();
}

bool is_dotted_pair(const std::string& s) {
    std::size_t a = digits_from(s, 0);
    if (a == 0 || a >= s.size() || s[a] != '.') return false;
    std::size_t b = digits_from(s, a + 1);
    return b > 0 && a + 1 + b == s.size();
}

namespace {

constexpr std::uint64_t kMaxCount = 2147483647;

// A tiny typed walker over a map: each `need`/`opt` call checks one property.
class Obj {
public:
    Obj(const Value* v, std::string path, Problems& p) : v_(v), path_(std::move(path)), p_(p) {
        if (v_ && !v_->is_map()) {
            p_.add(path_ + ": must be a map");
            v_ = nullptr;
        }
    }
    bool ok() const { return v_ != nullptr; }
    std::string at(const std::string& k) const { return path_.empty() ? k : path_ + "." + k; }

    const Value* need(const std::string& k) {
        if (!v_) return nullptr;
        const Value* f = v_->get(k);
        if (!f) p_.add(at(k) + ": required field missing");
        return f;
    }
    const Value* opt(const std::string& k) const { return v_ ? v_->get(k) : nullptr; }

    void only(std::initializer_list<const char*> keys) {
        if (!v_) return;
        for (const auto& kv : v_->as_map()) {
            bool known = false;
            for (const char* k : keys) known = known || kv.first == k;
            if (!known) p_.add(at(kv.first) + ": unknown field");
        }
    }

    // Typed checks; each returns the value when it has the type, else nullptr (problem added).
    const Value* str(const Value* f, const std::string& k) {
        if (f && !f->is_str()) { p_.add(at(k) + ": must be a string"); return nullptr; }
        return f;
    }
    const Value* uint(const Value* f, const std::string& k, std::uint64_t min = 0) {
        if (!f) return nullptr;
        if (f->type() != Value::Type::UInt && f->type() != Value::Type::Int) {
            p_.add(at(k) + ": must be an integer"); return nullptr;
        }
        if (f->type() == Value::Type::Int || f->as_uint() < min) {
            p_.add(at(k) + ": must be >= " + std::to_string(min)); return nullptr;
        }
        return f;
    }
    // JSON Schema "$defs/count": an integer in 1..2^31-1.
    const Value* count(const Value* f, const std::string& k) {
        const Value* v = uint(f, k, 1);
        if (v && v->as_uint() > kMaxCount) { p_.add(at(k) + ": must be <= 2147483647"); return nullptr; }
        return v;
    }
    // "$defs/opset": 1..999.
    void opset(const Value* f, const std::string& k) {
        const Value* v = uint(f, k, 1);
        if (v && v->as_uint() > 999) p_.add(at(k) + ": must be <= 999");
    }
    void integer(const Value* f, const std::string& k) {
        if (f && !f->is_int()) p_.add(at(k) + ": must be an integer");
    }
    void boolean(const Value* f, const std::string& k) {
        if (f && !f->is_bool()) p_.add(at(k) + ": must be a boolean");
    }
    void oneof(const Value* f, const std::string& k, std::initializer_list<const char*> values) {
        if (!str(f, k) || !f) return;
        for (const char* v : values)
            if (f->as_str() == v) return;
        std::string list;
        for (const char* v : values) list += std::string(list.empty() ? "" : ", ") + v;
        p_.add(at(k) + ": \"" + f->as_str() + "\" is not one of " + list);
    }
    void pattern(const Value* f, const std::string& k, bool (*pred)(const std::string&), const char* what) {
        if (str(f, k) && f && !pred(f->as_str())) p_.add(at(k) + ": not " + what);
    }
    void nullable_pattern(const Value* f, const std::string& k, bool (*pred)(const std::string&), const char* what) {
        if (f && !f->is_nil()) pattern(f, k, pred, what);
    }

    Problems& problems() { return p_; }

private:
    const Value* v_;
    std::string path_;
    Problems& p_;
};

void check_tensor(const Value& t, const std::string& path, bool strict, Problems& p) {
    Obj o(&t, path, p);
    if (!o.ok()) return;
    if (strict) o.only({"name", "dtype", "shape"});
    const Value* name = o.str(o.need("name"), "name");
    if (name && (name->as_str().empty() || utf8_length(name->as_str()) > 256))
        p.add(o.at("name") + ": must be 1..256 characters");
    o.oneof(o.need("dtype"), "dtype",
            {"float32", "float16", "bfloat16", "int64", "int32", "uint8", "int8", "bool"});
    const Value* shape = o.need("shape");
    if (!shape) return;
    if (!shape->is_array() || shape->as_array().empty() || shape->as_array().size() > 8) {
        p.add(o.at("shape") + ": must be an array of 1..8 dimensions");
        return;
    }
    for (std::size_t i = 0; i < shape->as_array().size(); ++i) {
        const Value& d = shape->as_array()[i];
        bool ok = (d.type() == Value::Type::UInt && d.as_uint() >= 1 && d.as_uint() <= kMaxCount) ||
                  (d.is_str() && d.as_str() == "batch");
        if (!ok) p.add(o.at("shape") + "[" + std::to_string(i) + "]: must be an integer in 1..2^31-1 or \"batch\"");
    }
}

void check_tensorrt_details(Obj& d) {
    d.str(d.need("tensorrt_version"), "tensorrt_version");
    d.pattern(d.need("compute_capability"), "compute_capability", is_dotted_pair, "a \"major.minor\" string");
    d.str(d.need("device_name"), "device_name");
    const Value* lvl = d.uint(d.need("optimization_level"), "optimization_level");
    if (lvl && lvl->as_uint() > 5) d.problems().add(d.at("optimization_level") + ": must be <= 5");
    Obj prof(d.need("profile"), d.at("profile"), d.problems());
    if (prof.ok())
        for (const char* k : {"min", "opt", "max"}) prof.count(prof.need(k), k);
    d.oneof(d.need("hardware_compatibility"), "hardware_compatibility", {"none", "ampere+", "same-compute-capability"});
    d.boolean(d.need("version_compatible"), "version_compatible");
    const Value* st = d.need("strongly_typed");
    if (st && !(st->is_bool() && st->as_bool())) d.problems().add(d.at("strongly_typed") + ": must be true");
    d.uint(d.need("layer_count"), "layer_count");
    d.uint(d.opt("workspace_bytes"), "workspace_bytes");
    d.nullable_pattern(d.opt("timing_cache_sha256"), "timing_cache_sha256", is_prefixed_sha256, "\"sha256:<hex>\"");
    d.pattern(d.opt("build_seconds"), "build_seconds", is_decimal, "a decimal string");
}

}  // namespace

void check_manifest(const Value& m, bool strict, Problems& p) {
    Obj top(&m, "", p);
    if (!top.ok()) return;
    if (strict)
        top.only({"format", "name", "family", "precision", "variant", "recipe", "source", "inputs",
                  "outputs", "batch", "engine", "build", "quality", "calibration", "rebuilt_from", "members"});

    Obj format(top.need("format"), "format", p);
    if (format.ok()) {
        if (strict) format.only({"major", "minor"});
        const Value* major = format.uint(format.need("major"), "major");
        if (major && major->as_uint() != 1) p.add("format.major: must be 1");
        format.uint(format.need("minor"), "minor");
    }
    top.pattern(top.need("name"), "name", is_bundle_name, "a valid bundle name");
    Obj family(top.need("family"), "family", p);
    if (family.ok()) {
        if (strict) family.only({"name", "version"});
        family.pattern(family.need("name"), "name", is_ident, "an identifier");
        const Value* v = family.str(family.need("version"), "version");
        if (v && v->as_str().empty()) p.add("family.version: must not be empty");
    }
    top.oneof(top.need("precision"), "precision", {"fp32", "fp16", "fp8"});
    top.nullable_pattern(top.need("variant"), "variant", is_ident, "an identifier");

    const Value* recipe = top.need("recipe");
    if (recipe && !recipe->is_nil()) {
        Obj r(recipe, "recipe", p);
        if (r.ok()) {
            if (strict) r.only({"name", "digest", "quantized_layers", "quantized_activations"});
            r.str(r.need("name"), "name");
            r.pattern(r.need("digest"), "digest", is_prefixed_sha256, "\"sha256:<hex>\"");
            r.uint(r.need("quantized_layers"), "quantized_layers");
            r.uint(r.opt("quantized_activations"), "quantized_activations");
        }
    }

    Obj source(top.need("source"), "source", p);
    if (source.ok()) {
        if (strict) source.only({"kind", "id", "revision", "file", "sha256", "seed"});
        const Value* kind = source.need("kind");
        source.oneof(kind, "kind", {"checkpoint", "random-weights"});
        source.str(source.opt("id"), "id");
        source.str(source.opt("revision"), "revision");
        source.str(source.opt("file"), "file");
        source.pattern(source.opt("sha256"), "sha256", is_prefixed_sha256, "\"sha256:<hex>\"");
        source.integer(source.opt("seed"), "seed");
        if (kind && kind->is_str() && kind->as_str() == "checkpoint") {
            source.need("id");
            source.need("sha256");
        } else if (kind && kind->is_str() && kind->as_str() == "random-weights") {
            source.need("seed");
        }
    }

    for (const char* side : {"inputs", "outputs"}) {
        const Value* arr = top.need(side);
        if (!arr) continue;
        if (!arr->is_array() || arr->as_array().empty() || arr->as_array().size() > 64) {
            p.add(std::string(side) + ": must be an array of 1..64 tensors");
            continue;
        }
        for (std::size_t i = 0; i < arr->as_array().size(); ++i)
            check_tensor(arr->as_array()[i], std::string(side) + "[" + std::to_string(i) + "]", strict, p);
    }

    Obj batch(top.need("batch"), "batch", p);
    if (batch.ok()) {
        if (strict) batch.only({"min", "opt", "max"});
        for (const char* k : {"min", "opt", "max"}) batch.count(batch.need(k), k);
    }

    Obj engine(top.need("engine"), "engine", p);
    if (engine.ok()) {
        if (strict) engine.only({"backend", "member", "details"});
        const Value* backend = engine.need("backend");
        engine.oneof(backend, "backend", {"onnxruntime", "tensorrt", "torch-aoti"});
        const Value* member = engine.need("member");
        engine.pattern(member, "member", is_member_name, "a member name");
        Obj details(engine.need("details"), "engine.details", p);
        if (backend && backend->is_str() && member && member->is_str() && details.ok()) {
            const std::string& b = backend->as_str();
            const char* expect = b == "onnxruntime" ? "model.onnx" : b == "tensorrt" ? "engine.plan"
                               : b == "torch-aoti" ? "engine.pt2" : nullptr;
            if (expect && member->as_str() != expect)
                p.add("engine.member: must be \"" + std::string(expect) + "\" for backend " + b);
            if (b == "onnxruntime") {
                if (strict) details.only({"opset", "min_onnxruntime"});
                details.opset(details.need("opset"), "opset");
                details.str(details.opt("min_onnxruntime"), "min_onnxruntime");
            } else if (b == "tensorrt") {
                if (strict)
                    details.only({"tensorrt_version", "compute_capability", "device_name", "optimization_level",
                                  "profile", "hardware_compatibility", "version_compatible", "strongly_typed",
                                  "layer_count", "workspace_bytes", "timing_cache_sha256", "build_seconds"});
                check_tensorrt_details(details);
            } else if (b == "torch-aoti") {
                details.str(details.need("torch_version"), "torch_version");
                const Value* cuda = details.need("cuda_version");
                if (cuda && !cuda->is_nil()) details.str(cuda, "cuda_version");
                details.nullable_pattern(details.need("compute_capability"), "compute_capability",
                                         is_dotted_pair, "a \"major.minor\" string");
                details.str(details.need("device_name"), "device_name");
                if (strict)
                    details.only({"torch_version", "cuda_version", "compute_capability", "device_name", "device",
                                  "compile_options", "fp8_padding", "batch_sizes", "static_batches",
                                  "build_seconds"});
                Obj opts(details.need("compile_options"), "engine.details.compile_options", p);
                details.oneof(details.opt("device"), "device", {"cuda", "cpu"});
                if (details.opt("fp8_padding")) Obj pad(details.opt("fp8_padding"), "engine.details.fp8_padding", p);
                for (const std::string key : {"batch_sizes", "static_batches"}) {
                    const Value* sizes = details.opt(key);
                    if (!sizes) continue;
                    if (!sizes->is_array() || sizes->as_array().size() > 1024) {
                        p.add("engine.details." + key + ": must be an array of at most 1024 sizes");
                    } else {
                        for (const Value& s : sizes->as_array()) details.count(&s, key + "[]");
                    }
                }
                details.pattern(details.opt("build_seconds"), "build_seconds", is_decimal, "a decimal string");
            }
        }
    }

    Obj build(top.need("build"), "build", p);
    if (build.ok()) {
        if (strict) build.only({"tool", "tool_version", "packages", "source_date_epoch", "opset", "build_seconds"});
        const Value* tool = build.str(build.need("tool"), "tool");
        if (tool && tool->as_str() != "trt-bundle") p.add("build.tool: must be \"trt-bundle\"");
        build.str(build.need("tool_version"), "tool_version");
        Obj pk(build.need("packages"), "build.packages", p);
        if (pk.ok() && build.need("packages")->as_map().size() > 1024)
            p.add("build.packages: more than 1024 entries");
        else if (pk.ok())
            for (const auto& kv : build.need("packages")->as_map()) pk.str(&kv.second, kv.first);
        const Value* sde = build.need("source_date_epoch");
        if (sde && !sde->is_nil()) build.uint(sde, "source_date_epoch");
        build.opset(build.opt("opset"), "opset");
        build.pattern(build.opt("build_seconds"), "build_seconds", is_decimal, "a decimal string");
    }

    const Value* quality = top.need("quality");
    if (quality && !quality->is_nil()) {
        Obj q(quality, "quality", p);
        if (q.ok()) {
            if (strict) q.only({"reference", "images", "inputs_source", "top1_agreement", "kl_mean",
                                "max_abs_diff", "nan_count", "inf_count"});
            q.str(q.need("reference"), "reference");
            q.uint(q.need("images"), "images");
            q.str(q.opt("inputs_source"), "inputs_source");
            for (const char* k : {"top1_agreement", "kl_mean", "max_abs_diff"})
                q.pattern(q.need(k), k, is_decimal, "a decimal string");
            q.uint(q.need("nan_count"), "nan_count");
            q.uint(q.need("inf_count"), "inf_count");
        }
    }

    const Value* calib = top.need("calibration");
    if (calib && !calib->is_nil()) {
        Obj c(calib, "calibration", p);
        if (c.ok()) {
            if (strict) c.only({"method", "percentile", "images", "data_digest", "data_source", "member"});
            c.oneof(c.need("method"), "method", {"max", "percentile", "entropy", "mse"});
            c.pattern(c.opt("percentile"), "percentile", is_decimal, "a decimal string");
            c.uint(c.need("images"), "images", 1);
            c.pattern(c.need("data_digest"), "data_digest", is_prefixed_sha256, "\"sha256:<hex>\"");
            c.str(c.need("data_source"), "data_source");
            c.oneof(c.need("member"), "member", {"calibration.safetensors"});
        }
    }

    top.nullable_pattern(top.need("rebuilt_from"), "rebuilt_from", is_hex64, "a 64-digit hex id");

    const Value* members = top.need("members");
    if (members) {
        if (!members->is_array() || members->as_array().empty() || members->as_array().size() > 256) {
            p.add("members: must be an array of 1..256 entries");
        } else {
            for (std::size_t i = 0; i < members->as_array().size(); ++i) {
                Obj e(&members->as_array()[i], "members[" + std::to_string(i) + "]", p);
                if (!e.ok()) continue;
                if (strict) e.only({"name", "offset", "stored_size", "raw_size", "sha256", "compression"});
                e.pattern(e.need("name"), "name", is_member_name, "a member name");
                e.uint(e.need("offset"), "offset", 64);
                e.uint(e.need("stored_size"), "stored_size", 1);
                e.uint(e.need("raw_size"), "raw_size");
                e.pattern(e.need("sha256"), "sha256", is_hex64, "64 lower-case hex digits");
                e.oneof(e.need("compression"), "compression", {"zstd"});
            }
        }
    }
}

namespace {

void check_ordered(const Value& sizes, const std::string& where, Problems& p) {
    std::uint64_t lo = sizes.get("min")->as_uint(), opt = sizes.get("opt")->as_uint(), hi = sizes.get("max")->as_uint();
    if (!(lo <= opt && opt <= hi))
        p.add(where + ": needs min <= opt <= max (got " + std::to_string(lo) + ", " + std::to_string(opt) + ", " +
              std::to_string(hi) + ")");
}

std::string range_text(const Value& sizes) {
    return std::to_string(sizes.get("min")->as_uint()) + "/" + std::to_string(sizes.get("opt")->as_uint()) + "/" +
           std::to_string(sizes.get("max")->as_uint());
}

}  // namespace

// docs/format.md, "Member size limits" (runtime_py/format/semantics.py): a reader holds a whole
// metadata member in memory, so its declared raw_size is bounded before anything is decompressed.
// 0: no limit (the graph and the engine member legitimately reach gigabytes).
std::uint64_t member_raw_size_limit(const std::string& name, const std::string& engine_member) {
    constexpr std::uint64_t kMiB = 1ull << 20;
    if (name == "model.onnx" || name == engine_member) return 0;
    if (name == "preprocess.msgpack" || name == "labels.msgpack") return kMiB;
    return 64 * kMiB;   // calibration.safetensors, reference.safetensors and any other member
}

void check_semantics(const Value& m, Problems& p) {
    const std::string& precision = m.get("precision")->as_str();
    std::vector<std::string> seen;
    for (const char* side : {"inputs", "outputs"}) {
        const Value::Array& tensors = m.get(side)->as_array();
        for (std::size_t i = 0; i < tensors.size(); ++i) {
            const std::string where = std::string(side) + "[" + std::to_string(i) + "]";
            const Value::Array& shape = tensors[i].get("shape")->as_array();
            std::size_t batch_axes = 0;
            for (const Value& d : shape) batch_axes += d.is_str();
            if (batch_axes != 1 || !shape[0].is_str())
                p.add(where + ".shape: the batch axis must appear exactly once, first");
            const std::string& name = tensors[i].get("name")->as_str();
            if (std::find(seen.begin(), seen.end(), name) != seen.end())
                p.add(where + ".name: tensor name \"" + name + "\" is used twice");
            seen.push_back(name);
            const std::string& dtype = tensors[i].get("dtype")->as_str();
            if (precision == "fp32" && (dtype == "float16" || dtype == "bfloat16"))
                p.add(where + ".dtype: " + dtype + " in an fp32 bundle");
        }
    }
    check_ordered(*m.get("batch"), "batch", p);
    const Value& engine = *m.get("engine");
    const std::string& backend = engine.get("backend")->as_str();
    const Value& details = *engine.get("details");
    if (backend == "tensorrt") {
        const Value& profile = *details.get("profile");
        const Value& batch = *m.get("batch");
        check_ordered(profile, "engine.details.profile", p);
        bool equal = true;
        for (const char* k : {"min", "opt", "max"}) equal = equal && profile.get(k)->as_uint() == batch.get(k)->as_uint();
        if (!equal)
            p.add("engine.details.profile: the TensorRT optimization profile must equal the batch range (profile " +
                  range_text(profile) + ", batch " + range_text(batch) +
                  "); rebuild the plan for the batch range or fix the manifest");
    }
    bool has_calibration_member = false, has_model = false;
    for (const Value& e : m.get("members")->as_array()) {
        has_calibration_member = has_calibration_member || e.get("name")->as_str() == "calibration.safetensors";
        has_model = has_model || e.get("name")->as_str() == "model.onnx";
    }
    if (!has_model) p.add("members: no model.onnx member (every bundle carries its ONNX graph, the source of every engine)");
    if (precision != "fp8") {
        for (const char* field : {"recipe", "calibration"})
            if (!m.get(field)->is_nil()) p.add(std::string(field) + ": only fp8 bundles have one (" + precision + " bundle)");
        if (has_calibration_member) p.add("members: calibration.safetensors in a " + precision + " bundle (fp8 only)");
    } else if (!has_calibration_member) {
        p.add("members: an fp8 bundle needs its calibration.safetensors member (the FP8 scales); rebuild it with "
              "`bundle make --precision fp8`");
    }
    if (precision == "fp8" && m.get("calibration")->is_nil())
        p.add("calibration: an fp8 bundle records how it was calibrated (got nil)");
    if (!m.get("calibration")->is_nil() && !has_calibration_member)
        p.add("calibration: the bundle has no calibration.safetensors member");
    const Value* device = details.get("device");
    if (backend == "torch-aoti" && device && device->as_str() == "cpu" && precision != "fp32")
        p.add("engine.details.device: torch-aoti CPU packages are fp32 only (" + precision + " bundle)");
    const Value* statics = backend == "torch-aoti" ? details.get("static_batches") : nullptr;
    if (statics) {
        const std::uint64_t lo = m.get("batch")->get("min")->as_uint(), hi = m.get("batch")->get("max")->as_uint();
        bool ok = true;
        std::uint64_t previous = 0;
        std::string listed;
        for (const Value& s : statics->as_array()) {
            const std::uint64_t n = s.as_uint();
            ok = ok && n > previous && lo <= n && n <= hi;
            previous = n;
            listed += (listed.empty() ? "" : ", ") + std::to_string(n);
        }
        if (!ok)
            p.add("engine.details.static_batches: [" + listed + "] must be ascending, each size once, within the "
                  "batch range " + std::to_string(lo) + ".." + std::to_string(hi));
    }
    const std::string& engine_member = engine.get("member")->as_str();
    for (const Value& e : m.get("members")->as_array()) {
        const std::string& name = e.get("name")->as_str();
        const std::uint64_t limit = member_raw_size_limit(name, engine_member);
        const std::uint64_t raw_size = e.get("raw_size")->as_uint();
        if (limit && raw_size > limit)
            p.add("members: " + name + " declares raw_size " + std::to_string(raw_size) + ", over its limit of " +
                  std::to_string(limit) + " bytes (docs/format.md, \"Member size limits\"): a hostile or corrupt bundle");
    }
}

void check_preprocess(const Value& v, Problems& p) {
    Obj top(&v, "preprocess", p);
    if (!top.ok()) return;
    top.only({"spec_version", "decode", "resize", "center_crop", "rescale", "normalize", "layout", "dtype",
              "in_engine", "input"});
    const Value* sv = top.need("spec_version");
    if (sv && !(sv->type() == Value::Type::UInt && sv->as_uint() == 1))
        p.add("preprocess.spec_version: must be 1 (this reader knows version 1 only)");
    Obj dec(top.need("decode"), "preprocess.decode", p);
    if (dec.ok()) { dec.only({"mode"}); dec.oneof(dec.need("mode"), "mode", {"RGB"}); }
    Obj rs(top.need("resize"), "preprocess.resize", p);
    if (rs.ok()) {
        rs.only({"size", "edge", "interpolation", "antialias"});
        const Value* size = rs.uint(rs.need("size"), "size", 1);
        if (size && size->as_uint() > 65535) p.add("preprocess.resize.size: must be <= 65535");
        rs.oneof(rs.need("edge"), "edge", {"shorter"});
        rs.oneof(rs.need("interpolation"), "interpolation", {"bicubic", "bilinear", "nearest", "lanczos"});
        rs.boolean(rs.need("antialias"), "antialias");
    }
    Obj cc(top.need("center_crop"), "preprocess.center_crop", p);
    if (cc.ok()) {
        cc.only({"height", "width"});
        for (const char* k : {"height", "width"}) {
            const Value* d = cc.uint(cc.need(k), k, 1);
            if (d && d->as_uint() > 65535) p.add(cc.at(k) + ": must be <= 65535");
        }
    }
    Obj re(top.need("rescale"), "preprocess.rescale", p);
    if (re.ok()) {
        re.only({"factor"});
        const Value* f = re.need("factor");
        if (f && !(f->is_number() && f->as_double() > 0)) p.add("preprocess.rescale.factor: must be a number > 0");
    }
    Obj nm(top.need("normalize"), "preprocess.normalize", p);
    if (nm.ok()) {
        nm.only({"mean", "std"});
        for (const char* k : {"mean", "std"}) {
            const Value* a = nm.need(k);
            if (!a) continue;
            if (!a->is_array() || a->as_array().size() != 3) {
                p.add(nm.at(k) + ": must be an array of 3 numbers");
                continue;
            }
            for (const Value& x : a->as_array()) {
                if (!x.is_number()) p.add(nm.at(k) + ": must hold numbers");
                else if (std::string(k) == "std" && !(x.as_double() > 0)) p.add(nm.at(k) + ": must be > 0");
            }
        }
    }
    // float32 NCHW (the host does every step), or uint8 NHWC pixels with the engine doing the
    // four steps listed in in_engine (schemas/preprocess.schema.json's if/then/else).
    const Value* dtype = top.need("dtype");
    top.oneof(dtype, "dtype", {"float32", "uint8"});
    const bool pixels = dtype && dtype->is_str() && dtype->as_str() == "uint8";
    const Value* layout = top.need("layout");
    top.oneof(layout, "layout", {"NCHW", "NHWC"});
    if (layout && layout->is_str() && (layout->as_str() == "NHWC") != pixels)
        p.add(pixels ? "preprocess.layout: must be NHWC when dtype is uint8"
                     : "preprocess.layout: must be NCHW when dtype is float32");
    const Value* steps = top.opt("in_engine");
    if (pixels && !steps) p.add("preprocess.in_engine: required field missing (dtype uint8)");
    if (!pixels && steps) p.add("preprocess.in_engine: only allowed when dtype is uint8");
    if (steps) {
        if (!steps->is_array()) {
            p.add("preprocess.in_engine: must be an array");
        } else {
            const auto& items = steps->as_array();
            std::vector<std::string> seen;
            for (const Value& x : items) {
                if (!x.is_str()) { p.add("preprocess.in_engine: must hold strings"); continue; }
                const std::string& s = x.as_str();
                if (s != "rescale" && s != "normalize" && s != "layout" && s != "cast")
                    p.add("preprocess.in_engine: \"" + s + "\" is not one of rescale, normalize, layout, cast");
                for (const std::string& t : seen)
                    if (t == s) p.add("preprocess.in_engine: items must be unique");
                seen.push_back(s);
            }
            if (pixels && items.size() != 4) p.add("preprocess.in_engine: must list 4 steps");
        }
    }
    const Value* in = top.str(top.need("input"), "input");
    if (in && in->as_str().empty()) p.add("preprocess.input: must not be empty");
}

}  // namespace detail
}  // namespace bundle
