// bundle_trt_loader: deserializes a bundle's TensorRT plan (TensorRT 10/11 C++ API), after the
// same compatibility checks as the Python runtime. Built only where NvInfer.h and libnvinfer are
// found at configure time.
#pragma once

#include <NvInferRuntime.h>

#include <memory>
#include <string>
#include <vector>

#include "bundle/reader.h"

namespace bundle {
namespace trt {

// Forwards TensorRT messages at or above `min_severity` to stderr.
class Logger : public nvinfer1::ILogger {
public:
    explicit Logger(Severity min_severity = Severity::kWARNING) : min_(min_severity) {}
    void log(Severity severity, nvinfer1::AsciiChar const* msg) noexcept override;
private:
    Severity min_;
};

struct IOTensor {
    std::string name;
    bool is_input = false;
    nvinfer1::DataType dtype{};
    nvinfer1::Dims shape{};   // -1 for dynamic axes
};

// Owns the runtime and the engine; the engine is destroyed first.
struct LoadedEngine {
    std::unique_ptr<nvinfer1::IRuntime> runtime;
    std::unique_ptr<nvinfer1::ICudaEngine> engine;
    std::vector<IOTensor> io;
    ~LoadedEngine() { engine.reset(); runtime.reset(); }
    LoadedEngine() = default;
    LoadedEngine(LoadedEngine&&) = default;
    LoadedEngine& operator=(LoadedEngine&&) = default;
};

// "major.minor.patch" of the libnvinfer loaded at run time (getInferLibVersion()).
std::string runtime_tensorrt_version();
// "major.minor" of CUDA device `device`.
std::string device_compute_capability(int device);

// Checks engine.backend == "tensorrt", the TensorRT version and compute capability
// (check_tensorrt_compatibility), verifies and decompresses engine.plan, deserializes it with
// nvinfer1::IRuntime on `device`, and checks that its I/O tensors are the manifest's inputs and
// outputs. Throws CompatibilityError / BundleError subclasses naming what does not match.
LoadedEngine load_engine(const Bundle& bundle, Logger& logger, int device = 0);

}  // namespace trt
}  // namespace bundle
