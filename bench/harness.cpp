#include "harness.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <numeric>
#include <random>
#include <sstream>

namespace hss::bench {
namespace {

double quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const auto lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  const double frac = pos - static_cast<double>(lo);
  return sorted[lo] * (1 - frac) + sorted[hi] * frac;
}

std::string json_escape(std::string_view text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out;
}

// JSON has no NaN or infinity: they are written as null, which --check reports anyway.
std::string json_number(double value) {
  if (!std::isfinite(value)) return "null";
  std::ostringstream s;
  s << std::setprecision(9) << value;
  return s.str();
}

std::string json_stats(const Stats& s) {
  return "{\"median\": " + json_number(s.median) + ", \"min\": " + json_number(s.min) +
         ", \"max\": " + json_number(s.max) + ", \"p25\": " + json_number(s.p25) +
         ", \"p75\": " + json_number(s.p75) + "}";
}

std::string params_text(const Params& p) {
  std::ostringstream s;
  if (p.chunk_size) s << " c" << p.chunk_size;
  if (p.hidden_dim) s << " h" << p.hidden_dim;
  if (p.tokens) s << " t" << p.tokens;
  if (p.layers) s << " L" << p.layers;
  if (p.threads) s << " T" << p.threads;
  const std::string text = s.str();
  return text.empty() ? "-" : text.substr(1);
}

std::string format_ratio(double ratio) {
  std::ostringstream s;
  s << std::fixed << std::setprecision(ratio >= 100 ? 0 : (ratio >= 10 ? 1 : 2)) << ratio << "x";
  return s.str();
}

bool sound(double value) { return std::isfinite(value) && value > 0; }

}  // namespace

Stats summarize(std::vector<double> values) {
  Stats s;
  if (values.empty()) return s;
  std::sort(values.begin(), values.end());
  s.min = values.front();
  s.max = values.back();
  s.median = quantile(values, 0.5);
  s.p25 = quantile(values, 0.25);
  s.p75 = quantile(values, 0.75);
  return s;
}

double seconds_since(const std::chrono::steady_clock::time_point& start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string format_bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB"};
  int unit = 0;
  while (bytes >= 1024 && unit < 3) {
    bytes /= 1024;
    ++unit;
  }
  std::ostringstream s;
  s << std::setprecision(bytes >= 100 ? 4 : 3) << bytes << " " << units[unit];
  return s.str();
}

std::string format_seconds(double seconds) {
  std::ostringstream s;
  s << std::fixed;
  if (seconds >= 1) {
    s << std::setprecision(2) << seconds << " s";
  } else if (seconds >= 1e-3) {
    s << std::setprecision(seconds >= 0.1 ? 1 : 2) << seconds * 1e3 << " ms";
  } else {
    s << std::setprecision(1) << seconds * 1e6 << " us";
  }
  return s.str();
}

const RefResult* Figure::ref(std::string_view ref_name) const {
  for (const RefResult& r : refs) {
    if (r.name == ref_name) return &r;
  }
  return nullptr;
}

namespace {

/// Where a figure has both single-thread copy references of the same bytes: a derived reference
/// "faster copy", whose time in each rep is the faster of the two in that rep (issue 22's "best
/// single-thread reference").
void add_faster_copy(Figure& f, const Timed& candidate, const std::vector<const Timed*>& all,
                     const std::vector<std::vector<double>>& times) {
  size_t memcpy_at = 0, stream_at = 0;
  for (size_t i = 1; i < all.size(); ++i) {
    if (all[i]->name == "memcpy") memcpy_at = i;
    if (all[i]->name == "stream copy") stream_at = i;
  }
  if (memcpy_at == 0 || stream_at == 0 || all[memcpy_at]->bytes != all[stream_at]->bytes) return;
  RefResult ref;
  ref.name = "faster copy";
  ref.bytes = all[memcpy_at]->bytes;
  std::vector<double> best, ratios;
  for (size_t rep = 0; rep < times[0].size(); ++rep) {
    best.push_back(std::min(times[memcpy_at][rep], times[stream_at][rep]));
    ratios.push_back((candidate.ratio_work() / times[0][rep]) /
                     (all[memcpy_at]->ratio_work() / best.back()));
  }
  ref.seconds = summarize(std::move(best));
  ref.ratio = summarize(std::move(ratios));
  f.refs.push_back(std::move(ref));
}

}  // namespace

const Figure& Report::measure(const std::string& workload, const std::string& name,
                              const Params& params, const Timed& candidate,
                              std::span<const Timed> references, int reps) {
  if (reps <= 0) reps = default_reps_;
  std::vector<const Timed*> all{&candidate};
  for (const Timed& r : references) all.push_back(&r);
  std::vector<std::vector<double>> times(all.size());

  auto time_one = [](const Timed& t) {
    if (t.prepare) t.prepare();
    const auto start = std::chrono::steady_clock::now();
    t.run();
    return seconds_since(start);
  };
  for (const Timed* t : all) (void)time_one(*t);  // warm-up: caches, recycler, lazy init
  // A new order every rep, shuffled with a fixed seed: what runs before a sample (its cache
  // traffic, a naive reference's 256 MiB munmap and dirty lines) is spread over every side alike.
  // A rotation did not do that: it keeps neighbours, so with three or more sides the candidate
  // always ran right after the last reference (retrieve fresh after the naive store: 0.78-0.94x
  // of the copies it matched in isolation, docs/perf.md).
  std::vector<size_t> order(all.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::mt19937 shuffler(0x22u + static_cast<uint32_t>(figures_.size()));
  for (int rep = 0; rep < reps; ++rep) {
    std::shuffle(order.begin(), order.end(), shuffler);
    for (size_t i : order) times[i].push_back(time_one(*all[i]));
  }

  Figure f;
  f.workload = workload;
  f.name = name;
  f.params = params;
  f.reps = reps;
  f.seconds = summarize(times[0]);
  f.bytes = candidate.bytes;
  f.tokens = candidate.tokens;
  for (size_t r = 1; r < all.size(); ++r) {
    RefResult ref;
    ref.name = all[r]->name;
    ref.seconds = summarize(times[r]);
    ref.bytes = all[r]->bytes;
    std::vector<double> ratios;
    for (int rep = 0; rep < reps; ++rep) {
      const double cand_rate = candidate.ratio_work() / times[0][static_cast<size_t>(rep)];
      const double ref_rate = all[r]->ratio_work() / times[r][static_cast<size_t>(rep)];
      ratios.push_back(cand_rate / ref_rate);
    }
    ref.ratio = summarize(std::move(ratios));
    f.refs.push_back(std::move(ref));
  }
  add_faster_copy(f, candidate, all, times);
  return add(std::move(f));
}

const Figure& Report::add(Figure figure) {
  figures_.push_back(std::move(figure));
  return figures_.back();
}

void Report::skip(const std::string& workload, const std::string& what, const std::string& reason) {
  skips_.push_back({workload, what, reason});
  std::cout << "  " << workload << "/" << what << ": skipped: " << reason << "\n";
}

void Report::note(const std::string& workload, const std::string& text) {
  notes_.push_back({workload, text});
  std::cout << "  note: " << text << "\n";
}

void Report::print_workload(const std::string& workload) const {
  std::ostringstream out;
  out << std::left << std::setw(34) << "case" << std::setw(24) << "params" << std::right
      << std::setw(10) << "median" << std::setw(20) << "p25..p75" << std::setw(9) << "GB/s"
      << "   ratio to references (median [p25, p75])\n";
  bool any = false;
  for (const Figure& f : figures_) {
    if (f.workload != workload) continue;
    any = true;
    const std::string spread = format_seconds(f.seconds.p25) + ".." + format_seconds(f.seconds.p75);
    std::ostringstream gb;
    gb << std::fixed << std::setprecision(2) << f.gbps();
    out << std::left << std::setw(34) << f.name << std::setw(24) << params_text(f.params)
        << std::right << std::setw(10) << format_seconds(f.seconds.median) << std::setw(20)
        << spread << std::setw(9) << gb.str() << "  ";
    for (const RefResult& r : f.refs) {
      // The reference's own rate, so an implausible reference (a misaligned copy) shows.
      std::ostringstream ref_gb;
      ref_gb << std::fixed << std::setprecision(1)
             << (r.seconds.median > 0 ? r.bytes / r.seconds.median / 1e9 : 0.0);
      out << " " << r.name << " " << format_ratio(r.ratio.median) << " ["
          << format_ratio(r.ratio.p25) << ", " << format_ratio(r.ratio.p75) << "] @" << ref_gb.str()
          << " GB/s;";
    }
    out << "\n";
  }
  if (any) std::cout << out.str() << std::flush;
}

const Figure* Report::find(const std::string& key, const Params& at) const {
  auto match = [](int64_t want, int64_t have) { return want == 0 || want == have; };
  for (const Figure& f : figures_) {
    const Params& p = f.params;
    if (f.workload + "/" + f.name == key && match(at.chunk_size, p.chunk_size) &&
        match(at.hidden_dim, p.hidden_dim) && match(at.tokens, p.tokens) &&
        match(at.layers, p.layers) && match(at.threads, p.threads)) {
      return &f;
    }
  }
  return nullptr;
}

Report::TargetResult Report::evaluate(const Target& target) const {
  TargetResult result;
  const Figure* f = find(target.figure, target.at);
  if (f == nullptr) return result;
  const RefResult* r = f->ref(target.reference);
  if (r == nullptr) return result;
  result.found = true;
  result.value = target.invert ? 1.0 / r->ratio.median : r->ratio.median;
  result.pass =
      target.at_most ? result.value <= target.threshold : result.value >= target.threshold;
  return result;
}

void Report::print_targets(std::span<const Target> targets) const {
  std::cout << "\n== targets (issues 6 and 22; a report, not an exit code) ==\n";
  for (const Target& t : targets) {
    const TargetResult r = evaluate(t);
    std::ostringstream line;
    line << std::left << std::setw(6) << (!r.found ? "n/a" : (r.pass ? "PASS" : "MISS"));
    line << std::setw(86) << t.text << " ";
    if (r.found) {
      line << std::right << std::fixed << std::setprecision(t.invert ? 5 : 2) << r.value
           << (t.at_most ? " <= " : " >= ") << t.threshold;
    } else {
      line << "(not measured in this run: " << t.figure << ")";
    }
    std::cout << line.str() << "\n";
  }
}

bool Report::write_json(const std::string& path, const std::string& command,
                        std::span<const Target> targets) const {
  std::ofstream out(path);
  if (!out) return false;
  out << "{\n  \"command\": \"" << json_escape(command) << "\",\n  \"figures\": [\n";
  for (size_t i = 0; i < figures_.size(); ++i) {
    const Figure& f = figures_[i];
    const Params& p = f.params;
    out << "    {\"workload\": \"" << json_escape(f.workload) << "\", \"name\": \""
        << json_escape(f.name) << "\", \"params\": {\"chunk_size\": " << p.chunk_size
        << ", \"hidden_dim\": " << p.hidden_dim << ", \"tokens\": " << p.tokens
        << ", \"layers\": " << p.layers << ", \"threads\": " << p.threads << ", \"dtype\": \""
        << json_escape(p.dtype) << "\", \"storage\": \"" << json_escape(p.storage)
        << "\", \"output\": \"" << json_escape(p.output) << "\"}, \"reps\": " << f.reps
        << ", \"bytes\": " << json_number(f.bytes) << ", \"tokens\": " << json_number(f.tokens)
        << ", \"seconds\": " << json_stats(f.seconds) << ", \"gbps\": " << json_number(f.gbps())
        << ", \"tokens_per_s\": " << json_number(f.tokens_per_s()) << ", \"refs\": [";
    for (size_t r = 0; r < f.refs.size(); ++r) {
      const RefResult& ref = f.refs[r];
      out << (r ? ", " : "") << "{\"name\": \"" << json_escape(ref.name)
          << "\", \"bytes\": " << json_number(ref.bytes)
          << ", \"seconds\": " << json_stats(ref.seconds) << ", \"gbps\": "
          << json_number(ref.seconds.median > 0 ? ref.bytes / ref.seconds.median / 1e9 : 0.0)
          << ", \"ratio\": " << json_stats(ref.ratio) << "}";
    }
    out << "]}" << (i + 1 < figures_.size() ? "," : "") << "\n";
  }
  out << "  ],\n  \"skipped\": [";
  for (size_t i = 0; i < skips_.size(); ++i) {
    out << (i ? ", " : "") << "{\"workload\": \"" << json_escape(skips_[i].workload)
        << "\", \"what\": \"" << json_escape(skips_[i].what) << "\", \"reason\": \""
        << json_escape(skips_[i].reason) << "\"}";
  }
  out << "],\n  \"notes\": [";
  for (size_t i = 0; i < notes_.size(); ++i) {
    out << (i ? ", " : "") << "{\"workload\": \"" << json_escape(notes_[i].workload)
        << "\", \"text\": \"" << json_escape(notes_[i].text) << "\"}";
  }
  out << "],\n  \"targets\": [";
  bool first = true;
  for (const Target& t : targets) {
    const TargetResult r = evaluate(t);
    out << (first ? "\n" : ",\n") << "    {\"text\": \"" << json_escape(t.text)
        << "\", \"figure\": \"" << json_escape(t.figure) << "\", \"reference\": \""
        << json_escape(t.reference) << "\", \"threshold\": " << json_number(t.threshold)
        << ", \"at_most\": " << (t.at_most ? "true" : "false")
        << ", \"measured\": " << (r.found ? json_number(r.value) : "null") << ", \"status\": \""
        << (!r.found ? "n/a" : (r.pass ? "PASS" : "MISS")) << "\"}";
    first = false;
  }
  out << "\n  ]\n}\n";
  return static_cast<bool>(out);
}

std::vector<std::string> Report::unsound_figures() const {
  std::vector<std::string> bad;
  for (const Figure& f : figures_) {
    const std::string key = f.workload + "/" + f.name;
    if (!sound(f.seconds.median) || !sound(f.bytes) || !sound(f.gbps())) {
      bad.push_back(key + " (time or rate)");
    }
    for (const RefResult& r : f.refs) {
      if (!sound(r.seconds.median) || !sound(r.ratio.median)) {
        bad.push_back(key + " vs " + r.name);
      }
    }
  }
  return bad;
}

}  // namespace hss::bench
