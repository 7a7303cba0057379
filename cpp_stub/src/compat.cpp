// The TensorRT compatibility rules, kept free of TensorRT so that they build and test anywhere.
#include <algorithm>
#include <string>
#include <vector>

#include "bundle/reader.h"
#include "checks.h"

namespace bundle {
namespace {

// Leading numeric components, like runtime_py.compat.parse_version: "11.4.0.106" -> {11, 4, 0, 106}.
std::vector<long> parse_version(const std::string& s) {
    std::vector<long> parts;
    std::size_t i = 0;
    while (i < s.size() && parts.size() < 8) {
        std::size_t j = i;
        long v = 0;
        while (j < s.size() && s[j] >= '0' && s[j] <= '9' && j - i < 9) v = v * 10 + (s[j++] - '0');
        if (j == i) break;
        parts.push_back(v);
        if (j == s.size() || s[j] != '.') break;
        i = j + 1;
    }
    return parts;
}

std::string join(const std::vector<long>& v, std::size_t n) {
    std::string s;
    for (std::size_t i = 0; i < n && i < v.size(); ++i) s += (i ? "." : "") + std::to_string(v[i]);
    return s;
}

}  // namespace

void check_tensorrt_compatibility(const EngineTarget& engine, const std::string& runtime_trt_version,
                                  const std::string& device_cc) {
    if (engine.backend != "tensorrt")
        throw CompatibilityError("engine backend is " + engine.backend + ", not tensorrt");
    const Value& d = engine.details;
    const Value* built = d.get("tensorrt_version");
    const Value* cc = d.get("compute_capability");
    const Value* hw = d.get("hardware_compatibility");
    const Value* vc = d.get("version_compatible");
    if (!built || !built->is_str() || !cc || !cc->is_str() || !hw || !hw->is_str() || !vc || !vc->is_bool())
        throw CompatibilityError("engine.details lacks tensorrt_version / compute_capability / "
                                 "hardware_compatibility / version_compatible");
    std::vector<std::string> problems;

    // TensorRT: same major.minor; version-compatible plans: same major and not older, or the
    // documented 10 -> 11 case (runtime_py.engines.tensorrt_compat.tensorrt_version_ok).
    const std::vector<long> b = parse_version(built->as_str()), r = parse_version(runtime_trt_version);
    if (b.empty()) problems.push_back("cannot parse the plan's TensorRT version \"" + built->as_str() + "\"");
    else if (r.empty()) problems.push_back("cannot parse the runtime TensorRT version \"" + runtime_trt_version + "\"");
    else if (vc->as_bool()) {
        bool ok = b[0] == r[0] ? !(r < b) : (b[0] == 10 && r[0] == 11);
        if (!ok)
            problems.push_back("plan built with TensorRT " + built->as_str() + " (version-compatible) runs on TensorRT " +
                               std::to_string(b[0]) + ".x from " + built->as_str() + " on; this is " + runtime_trt_version);
    } else {
        std::vector<long> b2(b.begin(), b.begin() + std::min<std::size_t>(2, b.size()));
        std::vector<long> r2(r.begin(), r.begin() + std::min<std::size_t>(2, r.size()));
        if (b2 != r2)
            problems.push_back("plan built with TensorRT " + built->as_str() + " needs TensorRT " + join(b, 2) +
                               ", this is " + runtime_trt_version + " (not version-compatible)");
    }

    // Compute capability: the same one, unless "ampere+" (>= 8.0).
    const std::vector<long> pc = parse_version(cc->as_str()), dc = parse_version(device_cc);
    if (pc.size() < 2 || dc.size() < 2)
        problems.push_back("cannot parse compute capability (plan \"" + cc->as_str() + "\", device \"" + device_cc + "\")");
    else if (hw->as_str() == "ampere+") {
        if (dc[0] < 8)
            problems.push_back("plan is hardware-compatible for Ampere and later (compute capability >= 8.0); "
                               "this GPU is " + device_cc);
    } else if (pc[0] != dc[0] || pc[1] != dc[1]) {
        problems.push_back("plan built for compute capability " + cc->as_str() + " (hardware_compatibility " +
                           hw->as_str() + "); this GPU is " + device_cc);
    }

    if (!problems.empty()) {
        std::string msg = "TensorRT plan is not compatible: ";
        for (std::size_t i = 0; i < problems.size(); ++i) msg += (i ? "; " : "") + problems[i];
        throw CompatibilityError(msg);
    }
}

}  // namespace bundle
