// JSON text of a Value: keys sorted by their UTF-8 bytes, like Python's json.dumps(sort_keys=True).
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "bundle/value.h"

namespace bundle {
namespace {

void put_string(std::string& out, const std::string& s) {
    out += '"';
    for (unsigned char c : s) {
        switch (c) {
            case '"': out += "\\\""; break;
            case '\\': out += "\\\\"; break;
            case '\n': out += "\\n"; break;
            case '\r': out += "\\r"; break;
            case '\t': out += "\\t"; break;
            case '\b': out += "\\b"; break;
            case '\f': out += "\\f"; break;
            default:
                if (c < 0x20) {
                    char buf[8];
                    std::snprintf(buf, sizeof buf, "\\u%04x", c);
                    out += buf;
                } else {
                    out += static_cast<char>(c);   // UTF-8 passes through (validated when decoded)
                }
        }
    }
    out += '"';
}

void put(std::string& out, const Value& v, int indent) {
    const std::string pad(static_cast<std::size_t>(indent + 2), ' ');
    switch (v.type()) {
        case Value::Type::Nil: out += "null"; break;
        case Value::Type::Bool: out += v.as_bool() ? "true" : "false"; break;
        case Value::Type::UInt: out += std::to_string(v.as_uint()); break;
        case Value::Type::Int: out += std::to_string(v.as_int()); break;
        case Value::Type::Float: {
            double d = v.as_double();
            if (!std::isfinite(d)) { out += "null"; break; }
            char buf[40];
            std::snprintf(buf, sizeof buf, "%.17g", d);
            out += buf;
            break;
        }
        case Value::Type::Str: put_string(out, v.as_str()); break;
        case Value::Type::Array: {
            const auto& a = v.as_array();
            if (a.empty()) { out += "[]"; break; }
            out += "[\n";
            for (std::size_t i = 0; i < a.size(); ++i) {
                out += pad;
                put(out, a[i], indent + 2);
                out += i + 1 < a.size() ? ",\n" : "\n";
            }
            out += std::string(static_cast<std::size_t>(indent), ' ') + "]";
            break;
        }
        case Value::Type::Map: {
            const auto& m = v.as_map();
            if (m.empty()) { out += "{}"; break; }
            std::vector<const std::pair<std::string, Value>*> items;
            for (const auto& kv : m) items.push_back(&kv);
            std::sort(items.begin(), items.end(),
                      [](const auto* a, const auto* b) { return a->first < b->first; });
            out += "{\n";
            for (std::size_t i = 0; i < items.size(); ++i) {
                out += pad;
                put_string(out, items[i]->first);
                out += ": ";
                put(out, items[i]->second, indent + 2);
                out += i + 1 < items.size() ? ",\n" : "\n";
            }
            out += std::string(static_cast<std::size_t>(indent), ' ') + "}";
            break;
        }
    }
}

}  // namespace

std::string to_json(const Value& v) {
    std::string out;
    put(out, v, 0);
    return out;
}

}  // namespace bundle
