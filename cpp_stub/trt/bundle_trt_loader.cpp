#include "bundle_trt_loader.h"

#include <NvInfer.h>
#include <cuda_runtime_api.h>

#include <cstdio>
#include <set>

namespace bundle {
namespace trt {

void Logger::log(Severity severity, nvinfer1::AsciiChar const* msg) noexcept {
    if (severity <= min_) std::fprintf(stderr, "[TensorRT] %s\n", msg ? msg : "");
}

std::string runtime_tensorrt_version() {
    // NV_TENSORRT_VERSION: major*10000 + minor*100 + patch since TensorRT 10,
    // major*1000 + minor*100 + patch before.
    const int v = getInferLibVersion();
    int major, minor, patch;
    if (v >= 100000) { major = v / 10000; minor = (v / 100) % 100; patch = v % 100; }
    else { major = v / 1000; minor = (v / 100) % 10; patch = v % 100; }
    return std::to_string(major) + "." + std::to_string(minor) + "." + std::to_string(patch);
}

std::string device_compute_capability(int device) {
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess)
        throw CompatibilityError("no CUDA device " + std::to_string(device) + " (cannot read its compute capability)");
    return std::to_string(major) + "." + std::to_string(minor);
}

LoadedEngine load_engine(const Bundle& bundle, Logger& logger, int device) {
    const EngineTarget target = bundle.engine();
    check_tensorrt_compatibility(target, runtime_tensorrt_version(), device_compute_capability(device));
    if (cudaSetDevice(device) != cudaSuccess)
        throw CompatibilityError("cannot select CUDA device " + std::to_string(device));

    const std::vector<std::uint8_t> plan = bundle.member(target.member);   // sha256-checked, bounded

    LoadedEngine out;
    out.runtime.reset(nvinfer1::createInferRuntime(logger));
    if (!out.runtime) throw CompatibilityError("TensorRT: createInferRuntime failed");
    const Value* vc = target.details.get("version_compatible");
    if (vc && vc->is_bool() && vc->as_bool())
        out.runtime->setEngineHostCodeAllowed(true);   // version-compatible plans embed the lean runtime
    out.engine.reset(out.runtime->deserializeCudaEngine(plan.data(), plan.size()));
    if (!out.engine)
        throw CompatibilityError("TensorRT could not deserialize " + target.member + " (see the TensorRT log above)");

    std::set<std::string> engine_in, engine_out, manifest_in, manifest_out;
    for (int32_t i = 0; i < out.engine->getNbIOTensors(); ++i) {
        IOTensor t;
        t.name = out.engine->getIOTensorName(i);
        t.is_input = out.engine->getTensorIOMode(t.name.c_str()) == nvinfer1::TensorIOMode::kINPUT;
        t.dtype = out.engine->getTensorDataType(t.name.c_str());
        t.shape = out.engine->getTensorShape(t.name.c_str());
        (t.is_input ? engine_in : engine_out).insert(t.name);
        out.io.push_back(std::move(t));
    }
    for (const auto& t : bundle.inputs()) manifest_in.insert(t.name);
    for (const auto& t : bundle.outputs()) manifest_out.insert(t.name);
    if (engine_in != manifest_in || engine_out != manifest_out)
        throw CompatibilityError("the plan's I/O tensors differ from the manifest's inputs/outputs");
    return out;
}

}  // namespace trt
}  // namespace bundle
