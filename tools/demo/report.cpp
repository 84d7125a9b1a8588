#include "demo/report.hpp"

#include <unistd.h>

#include <string_view>

#include "common/cli.hpp"

namespace hss::demo {
namespace {

double percent(double part, double whole) { return whole > 0 ? 100.0 * part / whole : 0.0; }
double gib_per_s(double bytes, double seconds) {
  return seconds > 0 ? bytes / seconds / (1024.0 * 1024.0 * 1024.0) : 0.0;
}

std::string with_commas(int64_t value) {
  const std::string digits = std::to_string(value);
  std::string out;
  const size_t sign = value < 0 ? 1 : 0;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

void row(std::FILE* out, std::string_view label, const std::string& value,
         const std::string& note = {}) {
  std::fprintf(out, "  %-32.*s %14s  %s\n", static_cast<int>(label.size()), label.data(),
               value.c_str(), note.c_str());
}

std::string fixed(double value, int digits) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", digits, value);
  return buf;
}

std::string json_string(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", c);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

}  // namespace

std::string join(std::span<const int64_t> values, std::string_view separator) {
  std::string out;
  for (size_t i = 0; i < values.size(); ++i) {
    if (i != 0) out.append(separator);
    out.append(std::to_string(values[i]));
  }
  return out;
}

void print_summary(std::FILE* out, const Summary& s) {
  const PipelineResult& p = s.pipeline;
  const std::string layers = join(s.layers, ",");
  std::fprintf(out, "\nhss-demo summary: %s path (%s), hidden_dim %lld, layers %s, chunk %lld\n",
               s.path.c_str(), s.path_detail.c_str(), static_cast<long long>(s.hidden_dim),
               layers.c_str(), static_cast<long long>(s.chunk_size));
  const auto tokens = static_cast<double>(p.prompt_tokens);
  row(out, "requests", with_commas(p.requests));
  row(out, "prompt tokens", with_commas(p.prompt_tokens));
  row(out, "KV hit tokens", with_commas(p.kv_hit_tokens),
      fixed(percent(static_cast<double>(p.kv_hit_tokens), tokens), 1) + "% of prompt tokens");
  row(out, "HS hit tokens (all retrieves)", with_commas(static_cast<int64_t>(s.hs.hit_tokens)),
      "talker + draft head, as the store counts them");
  row(out, "talker tokens not recomputed", with_commas(p.talker_hit_tokens),
      fixed(percent(static_cast<double>(p.talker_hit_tokens), tokens), 1) +
          "% restored for every layer");
  row(out, "talker tokens recomputed", with_commas(p.talker_recomputed));
  row(out, "draft head hits", with_commas(p.draft_hits) + "/" + with_commas(p.draft_lookups),
      with_commas(p.draft_rows_restored) + " rows not recomputed");
  row(out, "HS-only evictions", with_commas(static_cast<int64_t>(s.hs.hs_evictions)),
      "hidden-state pool pressure, KV kept");
  row(out, "coupled evictions", with_commas(static_cast<int64_t>(s.hs.coupled_evictions)),
      "hidden states dropped because their KV was evicted");
  row(out, "KV evictions", with_commas(static_cast<int64_t>(s.kv.evictions)));
  row(out, "mismatched rows", with_commas(p.mismatched_rows),
      p.mismatched_rows == 0 ? "every restored value bit-identical" : "RESTORE CHECK FAILED");
  row(out, "HS store throughput",
      fixed(gib_per_s(static_cast<double>(p.hs_store_bytes), p.hs_store_s), 2) + " GiB/s",
      cli::format_bytes(static_cast<double>(p.hs_store_bytes)) + " bf16 in " +
          fixed(p.hs_store_s, 3) + " s");
  row(out, "HS restore throughput",
      fixed(gib_per_s(static_cast<double>(p.hs_restore_bytes), p.hs_restore_s), 2) + " GiB/s",
      cli::format_bytes(static_cast<double>(p.hs_restore_bytes)) + " float32 in " +
          fixed(p.hs_restore_s, 3) + " s");
  row(out, "HS pool", cli::format_bytes(static_cast<double>(s.hs.bytes_held)),
      "held of " + cli::format_bytes(static_cast<double>(s.hs.pool_capacity_bytes)));
  row(out, "KV pool", cli::format_bytes(static_cast<double>(s.kv.bytes_held)),
      "held of " + cli::format_bytes(static_cast<double>(s.kv.capacity_bytes)));
  row(out, "wall time", fixed(s.wall_s, 2) + " s");
}

std::string to_json(const Summary& s) {
  const PipelineResult& p = s.pipeline;
  std::string out = "{\n";
  auto field = [&](std::string_view key, const std::string& value, bool last = false) {
    out.append("  ")
        .append(json_string(key))
        .append(": ")
        .append(value)
        .append(last ? "\n" : ",\n");
  };
  auto num = [](auto v) { return std::to_string(v); };
  // Appends, not "[" + string: GCC 12 warns falsely (-Wrestrict) on literal + std::string.
  std::string layers = "[";
  layers.append(join(s.layers, ", ")).append("]");
  field("path", json_string(s.path));
  field("path_detail", json_string(s.path_detail));
  field("chunk_size", num(s.chunk_size));
  field("hidden_dim", num(s.hidden_dim));
  field("layers", layers);
  field("seed", num(s.seed));
  field("requests", num(p.requests));
  field("prompt_tokens", num(p.prompt_tokens));
  field("kv_hit_tokens", num(p.kv_hit_tokens));
  field("hs_hit_tokens", num(s.hs.hit_tokens));
  field("talker_tokens_not_recomputed", num(p.talker_hit_tokens));
  field("talker_tokens_recomputed", num(p.talker_recomputed));
  field("draft_lookups", num(p.draft_lookups));
  field("draft_hits", num(p.draft_hits));
  field("draft_rows_restored", num(p.draft_rows_restored));
  field("hs_only_evictions", num(s.hs.hs_evictions));
  field("coupled_evictions", num(s.hs.coupled_evictions));
  field("kv_evictions", num(s.kv.evictions));
  field("hs_allocation_failures", num(s.hs.allocation_failures));
  field("kv_put_failures", num(s.kv.put_failures));
  field("chunks_stored", num(p.chunks_stored));
  field("mismatches", num(p.mismatched_rows));
  std::string first = "[";
  for (size_t i = 0; i < p.mismatches.size(); ++i) {
    if (i != 0) first += ", ";
    first += json_string(p.mismatches[i].describe());
  }
  field("mismatch_examples", first + "]");
  field("store_bytes", num(p.hs_store_bytes));
  field("store_seconds", fixed(p.hs_store_s, 6));
  field("store_gib_per_s",
        fixed(gib_per_s(static_cast<double>(p.hs_store_bytes), p.hs_store_s), 3));
  field("restore_bytes", num(p.hs_restore_bytes));
  field("restore_seconds", fixed(p.hs_restore_s, 6));
  field("restore_gib_per_s",
        fixed(gib_per_s(static_cast<double>(p.hs_restore_bytes), p.hs_restore_s), 3));
  field("kv_store_bytes", num(p.kv_store_bytes));
  field("kv_store_seconds", fixed(p.kv_store_s, 6));
  field("kv_restore_bytes", num(p.kv_restore_bytes));
  field("kv_restore_seconds", fixed(p.kv_restore_s, 6));
  field("hs_pool_bytes", num(s.hs.pool_capacity_bytes));
  field("kv_pool_bytes", num(s.kv.capacity_bytes));
  field("wall_seconds", fixed(s.wall_s, 3), true);
  return out + "}\n";
}

Progress::Progress(bool quiet)
    : quiet_(quiet),
      tty_(isatty(STDERR_FILENO) == 1),
      last_(std::chrono::steady_clock::now()),
      start_(last_) {}

void Progress::update(const PipelineResult& p, int total) {
  if (quiet_) return;
  const auto now = std::chrono::steady_clock::now();
  const bool last = p.requests == total;
  const int64_t step = std::max(1, total / 10);
  if (tty_ ? (!last && now - last_ < std::chrono::milliseconds(100))
           : (!last && p.requests % step != 0)) {
    return;
  }
  last_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  std::fprintf(
      stderr, "%s[%lld/%d] %s tokens, KV hit %.1f%%, HS hit %.1f%%, %.1f s%s", tty_ ? "\r" : "",
      static_cast<long long>(p.requests), total, with_commas(p.prompt_tokens).c_str(),
      percent(static_cast<double>(p.kv_hit_tokens), static_cast<double>(p.prompt_tokens)),
      percent(static_cast<double>(p.talker_hit_tokens), static_cast<double>(p.prompt_tokens)),
      elapsed, tty_ ? "\033[K" : "\n");
  line_open_ = tty_;
  std::fflush(stderr);
}

void Progress::finish() {
  if (line_open_) std::fputc('\n', stderr);
  line_open_ = false;
}

}  // namespace hss::demo
