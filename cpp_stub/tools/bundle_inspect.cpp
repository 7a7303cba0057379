// bundle-inspect-cpp PATH [--json] [--verify] [--preprocess] [--trt-compat TRT_VERSION CC]
// bundle-inspect-cpp --batch   (paths on stdin, one a line; open + verify each)
// Exit 0 on success, 1 when the bundle is rejected (one line on stderr), 2 on usage errors.
#include <cstdio>
#include <cstring>
#include <exception>
#include <iostream>
#include <new>
#include <string>

#include "bundle/reader.h"

namespace {

const char* kUsage =
    "usage: bundle-inspect-cpp PATH [--json] [--verify] [--preprocess] [--trt-compat TRT_VERSION CC]\n"
    "  --json        the manifest as JSON plus id, path, file_size, random_weights, members[].ratio\n"
    "  --verify      decompress every member and check its sha256\n"
    "  --preprocess  print the decoded preprocess.msgpack spec\n"
    "  --trt-compat  check the TensorRT plan against a TensorRT version and compute capability\n"
    "  --batch       read paths from stdin, one a line; open and verify each and print one line\n"
    "                per path: \"OK <bundle id>\" or \"ERR <why>\" (one process for many files)\n";

std::string dims(const bundle::TensorSpec& t) {
    std::string s = "[";
    for (std::size_t i = 0; i < t.shape.size(); ++i) {
        if (i) s += ", ";
        s += t.shape[i] == bundle::TensorSpec::kBatch ? "batch" : std::to_string(t.shape[i]);
    }
    return s + "]";
}

void summary(const bundle::Bundle& b, bool verified) {
    const bundle::Value& m = b.manifest();
    auto str = [&](const char* k) { const bundle::Value* v = m.get(k); return v && v->is_str() ? v->as_str() : std::string("-"); };
    std::printf("%s\n", str("name").c_str());
    std::printf("  id          %s\n", b.id().c_str());
    std::printf("  format      %u.%u, %llu bytes\n", b.header().major, b.header().minor,
                static_cast<unsigned long long>(b.file_size()));
    std::printf("  precision   %s%s\n", str("precision").c_str(), b.random_weights() ? " (random weights)" : "");
    auto e = b.engine();
    std::printf("  engine      %s (%s)\n", e.backend.c_str(), e.member.c_str());
    auto br = b.batch();
    std::printf("  batch       %llu..%llu (opt %llu)\n", static_cast<unsigned long long>(br.min),
                static_cast<unsigned long long>(br.max), static_cast<unsigned long long>(br.opt));
    for (const auto& t : b.inputs()) std::printf("  input       %s %s %s\n", t.name.c_str(), t.dtype.c_str(), dims(t).c_str());
    for (const auto& t : b.outputs()) std::printf("  output      %s %s %s\n", t.name.c_str(), t.dtype.c_str(), dims(t).c_str());
    for (const auto& mem : b.members())
        std::printf("  member      %-26s %12llu -> %12llu bytes\n", mem.name.c_str(),
                    static_cast<unsigned long long>(mem.stored_size), static_cast<unsigned long long>(mem.raw_size));
    std::printf("  members     %s\n", verified ? "verified (sha256 of every member)" : "not verified (use --verify)");
}

// Messages quote manifest text: keep them on one line whatever it holds.
std::string one_line(const char* what) {
    std::string s(what);
    for (char& c : s)
        if (c == '\n' || c == '\r' || c == '\0') c = ' ';
    return s;
}

// One line for one path: what the differential fuzz test (tests/test_fuzz_readers.py) reads.
std::string open_and_verify(const std::string& path) {
    try {
        bundle::Bundle b = bundle::Bundle::open(path);
        b.verify();
        return "OK " + b.id();
    } catch (const bundle::BundleError& e) {
        return "ERR " + one_line(e.what());
    } catch (const std::bad_alloc&) {
        return "ERR out of memory";
    } catch (const std::exception& e) {
        return "ERR " + one_line(e.what());
    }
}

int batch() {
    std::string path;
    while (std::getline(std::cin, path)) {
        std::string line = open_and_verify(path);
        std::fwrite(line.data(), 1, line.size(), stdout);
        std::fputc('\n', stdout);
        if (std::fflush(stdout) != 0) return 1;
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::string path, trt_version, cc;
    bool json = false, verify = false, pre = false, compat = false;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--batch" && argc == 2) return batch();
        if (a == "--json") json = true;
        else if (a == "--verify") verify = true;
        else if (a == "--preprocess") pre = true;
        else if (a == "--trt-compat" && i + 2 < argc) { compat = true; trt_version = argv[++i]; cc = argv[++i]; }
        else if (a == "-h" || a == "--help") { std::fputs(kUsage, stdout); return 0; }
        else if (!a.empty() && a[0] == '-' && a != "-") { std::fprintf(stderr, "bundle-inspect-cpp: unknown option %s\n%s", a.c_str(), kUsage); return 2; }
        else if (path.empty()) path = a;
        else { std::fprintf(stderr, "bundle-inspect-cpp: one PATH only\n%s", kUsage); return 2; }
    }
    if (path.empty()) { std::fputs(kUsage, stderr); return 2; }
    try {
        bundle::Bundle b = bundle::Bundle::open(path);
        if (verify) b.verify();
        if (compat) bundle::check_tensorrt_compatibility(b.engine(), trt_version, cc);
        if (pre) {
            auto p = b.preprocess();
            if (!p) { std::printf("no preprocess.msgpack member\n"); }
            else {
                std::printf("resize %u (%s edge, %s, antialias %s) -> crop %ux%u, x%.9g, mean [%.9g, %.9g, %.9g], "
                            "std [%.9g, %.9g, %.9g], %s %s -> input %s\n",
                            p->resize_size, p->resize_edge.c_str(), p->interpolation.c_str(), p->antialias ? "on" : "off",
                            p->crop_height, p->crop_width, p->rescale_factor, p->mean[0], p->mean[1], p->mean[2],
                            p->std[0], p->std[1], p->std[2], p->layout.c_str(), p->dtype.c_str(), p->input.c_str());
            }
        }
        if (json) std::printf("%s\n", b.inspect_json().c_str());
        else if (!pre) summary(b, verify);
        return std::fflush(stdout) == 0 ? 0 : 1;
    } catch (const bundle::BundleError& e) {
        std::fprintf(stderr, "bundle-inspect-cpp: %s: %s\n", path.c_str(), one_line(e.what()).c_str());
    } catch (const std::bad_alloc&) {
        std::fprintf(stderr, "bundle-inspect-cpp: %s: out of memory\n", path.c_str());
    } catch (const std::exception& e) {
        std::fprintf(stderr, "bundle-inspect-cpp: %s: %s\n", path.c_str(), one_line(e.what()).c_str());
    }
    return 1;
}
