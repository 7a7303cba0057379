// The TensorRT compatibility rules, kept free of TensorRT so that they build and test anywhere.
#include <cerrno>
#include <cstdlib>

#include "bundle/reader.h"
#include "checks.h"

namespace bundle {
namespace {

struct Ver { long major = -1, minor = -1, patch = 0; };

// "10.7.0", "10.7", "10.7.0.23" -> {10, 7, 0}; {-1,-1} when not parseable.
Ver parse_version(const std::string& s) {
    Ver v;
    const char* p = s.c_str();
    char* end = nullptr;
    long parts[3] = {-1, -1, 0};
    for (int i = 0; i < 3; ++i) {
        if (*p < '0' || *p > '9') break;
        errno = 0;
        parts[i] = std::strtol(p, &end, 10);
        if (errno || parts[i] > 100000) return Ver{};
        p = end;
        if (*p != '.') break;
        ++p;
    }
    v.major = parts[0];
    v.minor = parts[1];
    v.patch = parts[2];
    return v;
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

    Ver b = parse_version(built->as_str()), r = parse_version(runtime_trt_version);
    if (b.minor < 0) problems.push_back("cannot parse the plan's TensorRT version \"" + built->as_str() + "\"");
    else if (r.minor < 0) problems.push_back("cannot parse the runtime TensorRT version \"" + runtime_trt_version + "\"");
    else if (vc->as_bool()) {
        // version-compatible plans run on the same major, at the build's version or later
        if (r.major != b.major || r.minor < b.minor || (r.minor == b.minor && r.patch < b.patch))
            problems.push_back("plan built with TensorRT " + built->as_str() + " (version-compatible) needs TensorRT " +
                               std::to_string(b.major) + ".x >= " + built->as_str() + ", this is " + runtime_trt_version);
    } else if (r.major != b.major || r.minor != b.minor) {
        problems.push_back("plan built with TensorRT " + built->as_str() + " needs TensorRT " +
                           std::to_string(b.major) + "." + std::to_string(b.minor) + ", this is " +
                           runtime_trt_version + " (not version-compatible)");
    }

    Ver pc = parse_version(cc->as_str()), dc = parse_version(device_cc);
    if (pc.minor < 0 || dc.minor < 0)
        problems.push_back("cannot parse compute capability (plan \"" + cc->as_str() + "\", device \"" + device_cc + "\")");
    else if (hw->as_str() == "ampere+") {
        if (dc.major < 8)
            problems.push_back("plan is hardware-compatible for Ampere and later (compute capability >= 8.0); "
                               "this GPU is " + device_cc);
    } else if (pc.major != dc.major || pc.minor != dc.minor) {
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
