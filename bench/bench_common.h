// Shared pieces of specd's C++ benchmark binaries: command-line flags, timing, medians and
// a small JSON writer (numbers, strings, nested objects/arrays) for --json output.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

namespace specd::bench {

struct Flags {
  bool quick = false;       // reduced sweep for smoke tests
  std::string json_path;    // write results here when set
  int reps = 5;             // repetitions per point; the median is reported

  // Parses --quick, --json PATH, --reps N, --help. Exits on --help or a bad flag.
  static Flags parse(int argc, char** argv, const char* usage) {
    Flags f;
    for (int i = 1; i < argc; ++i) {
      const char* a = argv[i];
      if (!std::strcmp(a, "--quick")) {
        f.quick = true;
      } else if (!std::strcmp(a, "--json") && i + 1 < argc) {
        f.json_path = argv[++i];
      } else if (!std::strcmp(a, "--reps") && i + 1 < argc) {
        f.reps = std::atoi(argv[++i]);
        if (f.reps < 1) die(usage, "--reps must be >= 1");
      } else if (!std::strcmp(a, "--help") || !std::strcmp(a, "-h")) {
        std::printf("%s\n", usage);
        std::exit(0);
      } else {
        die(usage, (std::string("unknown or incomplete flag: ") + a).c_str());
      }
    }
    return f;
  }

  [[noreturn]] static void die(const char* usage, const char* why) {
    std::fprintf(stderr, "error: %s\n%s\n", why, usage);
    std::exit(2);
  }
};

inline double now_ns() {
  return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                 std::chrono::steady_clock::now().time_since_epoch())
                                 .count());
}

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n == 0 ? 0.0 : (n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
}

// Keeps the optimizer from deleting work whose result is otherwise unused.
template <class T>
inline void do_not_optimize(const T& value) {
  asm volatile("" : : "r,m"(value) : "memory");
}

// Minimal streaming JSON writer: w.begin_object(); w.key("a"); w.value(1); w.end_object().
class JsonWriter {
 public:
  void begin_object() { open('{'); }
  void end_object() { close('}'); }
  void begin_array() { open('['); }
  void end_array() { close(']'); }
  void key(const std::string& k) {
    comma();
    write_string(k);
    out_ += ':';
    after_key_ = true;
  }
  void value(double v) {
    comma();
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.6g", v);
    out_ += buf;
  }
  void value(long long v) { comma(); out_ += std::to_string(v); }
  void value(int v) { value(static_cast<long long>(v)); }
  void value(bool v) { comma(); out_ += v ? "true" : "false"; }
  void value(const std::string& v) { comma(); write_string(v); }
  void value(const char* v) { value(std::string(v)); }
  template <class T>
  void field(const std::string& k, const T& v) { key(k); value(v); }

  const std::string& str() const { return out_; }
  bool write_file(const std::string& path) const {
    FILE* f = std::fopen(path.c_str(), "w");
    if (!f) return false;
    const bool ok = std::fwrite(out_.data(), 1, out_.size(), f) == out_.size();
    return std::fclose(f) == 0 && ok;
  }

 private:
  void open(char c) { comma(); out_ += c; first_.push_back(true); }
  void close(char c) { out_ += c; first_.pop_back(); }
  void comma() {
    if (after_key_) { after_key_ = false; return; }
    if (!first_.empty()) {
      if (!first_.back()) out_ += ',';
      first_.back() = false;
    }
  }
  void write_string(const std::string& s) {
    out_ += '"';
    for (char c : s) {
      if (c == '"' || c == '\\') { out_ += '\\'; out_ += c; }
      else if (static_cast<unsigned char>(c) < 0x20) { char b[8]; std::snprintf(b, sizeof b, "\\u%04x", c); out_ += b; }
      else out_ += c;
    }
    out_ += '"';
  }
  std::string out_;
  std::vector<bool> first_;
  bool after_key_ = false;
};

// Facts about the build, for the JSON header.
inline void write_build_info(JsonWriter& w) {
  w.key("build");
  w.begin_object();
  w.field("compiler", __VERSION__);
#ifdef SPECD_BENCH_BUILD_TYPE
  w.field("build_type", SPECD_BENCH_BUILD_TYPE);
#endif
#ifdef NDEBUG
  w.field("assertions", false);
#else
  w.field("assertions", true);
#endif
  w.end_object();
}

}  // namespace specd::bench
