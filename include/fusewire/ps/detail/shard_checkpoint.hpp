#pragma once
/// ps::shard's checkpoints: save() writes every value, slot, the global step
/// and each worker's last request to one file (through detail::write_atomically,
/// so a crash leaves the old file or the new one); restore() loads it back.
/// The file (little-endian):
///
///     "FWPSCKP1"  u64 model fingerprint  u32 ps index  u32 num_ps  u64 global step
///     u32 dense slice count; per slice: u32 var, u32 slice, u64 updates, u64 floats, f32 values+slots
///     u32 embedding count;   per table: u32 var, u64 rows; per row: i64 id, u64 updates, f32 values+slots
///     u32 worker count;      per worker: u8 seen, u64 client incarnation, u64 last sequence number
///                            (so a request applied just before a crash is not applied again after restore)
///     u64 FNV-1a of every byte before it

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <filesystem>
#include <span>
#include <string>
#include <string_view>
#include <system_error>
#include <unordered_map>
#include <utility>
#include <vector>

#include <fusewire/core/error.hpp>
#include <fusewire/ps/detail/atomic_file.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/shard.hpp>

namespace fusewire {
inline namespace v0 {
namespace ps {

inline void shard::save(const std::filesystem::path& file) {
  std::vector<std::byte> out;
  auto put = [&out](auto v) {
    const std::size_t at = out.size();
    out.resize(at + sizeof(v));
    std::byte* p = out.data() + at;
    detail::put(p, v);
  };
  auto put_floats = [&out](std::span<const float> f) {
    const std::size_t at = out.size();
    out.resize(at + f.size() * 4);
    std::byte* p = out.data() + at;
    detail::put_array(p, f.data(), f.size());
  };
  for (char c : std::string_view("FWPSCKP1")) out.push_back(static_cast<std::byte>(c));
  put(fingerprint_);
  put(index_);
  put(static_cast<std::uint32_t>(place_.num_ps()));
  put(global_step_);
  put(static_cast<std::uint32_t>(dense_.size()));
  for (const dense_state& d : dense_) {
    put(d.var);
    put(d.slice);
    put(d.updates);
    put(static_cast<std::uint64_t>(d.values_view().size() + d.slots.size()));
    put_floats(d.values_view());
    put_floats(d.slots);
  }
  std::uint32_t tables = 0;
  for (std::uint32_t v = 0; v < model_.variables.size(); ++v)
    tables += model_.variables[v].kind == variable_kind::embedding;
  put(tables);
  for (std::uint32_t v = 0; v < model_.variables.size(); ++v) {
    if (model_.variables[v].kind != variable_kind::embedding) continue;
    put(v);
    put(static_cast<std::uint64_t>(rows_[v].size()));
    // Sorted by id so the same state always writes the same bytes.
    std::vector<std::int64_t> ids;
    ids.reserve(rows_[v].size());
    for (const auto& [id, r] : rows_[v]) ids.push_back(id);
    std::sort(ids.begin(), ids.end());
    for (std::int64_t id : ids) {
      const row_state& r = rows_[v].at(id);
      put(id);
      put(r.updates);
      put_floats(r.data);
    }
  }
  put(static_cast<std::uint32_t>(workers_.size()));
  for (const worker_state& w : workers_) {
    put(static_cast<std::uint8_t>(w.seen));
    put(w.incarnation);
    put(w.last_seq);
  }
  put(fnv_bytes(out));
  detail::write_atomically(file, out);
  ++stats_.checkpoints;
}

inline void shard::restore(const std::filesystem::path& file) {
  const std::string name = file.string();
  auto bad = [&](const std::string& what) -> void {
    throw_error(errc::invalid_argument, "checkpoint " + name + ": " + what);
  };
  std::vector<std::byte> in;
  {
    std::FILE* f = std::fopen(name.c_str(), "rb");
    if (f == nullptr) throw std::system_error(errno, std::generic_category(), "checkpoint " + name + ": cannot open");
    std::byte chunk[65536];
    std::size_t n = 0;
    while ((n = std::fread(chunk, 1, sizeof chunk, f)) > 0) in.insert(in.end(), chunk, chunk + n);
    std::fclose(f);
  }
  if (in.size() < 8 + 8 + 4 + 4 + 8 + 4 + 4 + 4 + 8) bad("too short (" + std::to_string(in.size()) + " bytes)");
  const std::size_t body = in.size() - 8;
  if (detail::get<std::uint64_t>(in.data() + body) != fnv_bytes(std::span<const std::byte>(in.data(), body))) {
    bad("checksum mismatch (corrupt or truncated)");
  }
  if (std::memcmp(in.data(), "FWPSCKP1", 8) != 0) bad("not a fusewire PS checkpoint");
  std::size_t pos = 8;
  auto need = [&](std::size_t n) {
    if (n > body - pos) bad("truncated at byte " + std::to_string(pos));
  };
  auto take = [&]<class T>(T) {
    need(sizeof(T));
    const T v = detail::get<T>(in.data() + pos);
    pos += sizeof(T);
    return v;
  };
  if (take(std::uint64_t{}) != fingerprint_) bad("written for a different model_spec or PS count");
  const auto idx = take(std::uint32_t{});
  const auto nps = take(std::uint32_t{});
  if (idx != index_ || nps != place_.num_ps()) {
    bad("written by ps " + std::to_string(idx) + " of " + std::to_string(nps) + ", this is ps " +
        std::to_string(index_) + " of " + std::to_string(place_.num_ps()));
  }
  const auto step = take(std::uint64_t{});
  // Read into the side first: a bad file leaves the shard unchanged.
  struct dense_read {
    std::uint64_t updates = 0;
    std::size_t at = 0;  ///< where its values+slots start in `in`
    bool read = false;
  };
  std::vector<dense_read> dense(dense_.size());
  const auto nd = take(std::uint32_t{});
  if (nd != dense.size()) bad(std::to_string(nd) + " dense slices, expected " + std::to_string(dense.size()));
  for (std::uint32_t i = 0; i < nd; ++i) {
    const auto var = take(std::uint32_t{});
    const auto slice = take(std::uint32_t{});
    if (var >= dense_index_.size() || slice >= dense_index_[var].size() || dense_index_[var][slice] == npos) {
      bad("dense slice " + std::to_string(var) + "/" + std::to_string(slice) + " does not belong to this PS");
    }
    const dense_state& d = dense_[dense_index_[var][slice]];
    dense_read& r = dense[dense_index_[var][slice]];
    if (r.read) bad("dense slice " + std::to_string(var) + "/" + std::to_string(slice) + " is in it twice");
    r.read = true;
    r.updates = take(std::uint64_t{});
    const auto n = take(std::uint64_t{});
    const std::size_t floats = d.values_view().size() + d.slots.size();
    if (n != floats)
      bad("slice of '" + model_.variables[var].name + "' has " + std::to_string(n) + " floats, expected " +
          std::to_string(floats));
    need(n * 4);
    r.at = pos;
    pos += n * 4;
  }
  std::vector<std::unordered_map<std::int64_t, row_state>> rows(model_.variables.size());
  const auto nt = take(std::uint32_t{});
  for (std::uint32_t t = 0; t < nt; ++t) {
    const auto var = take(std::uint32_t{});
    if (var >= model_.variables.size() || model_.variables[var].kind != variable_kind::embedding)
      bad("table " + std::to_string(var) + " is not an embedding");
    const auto count = take(std::uint64_t{});
    const std::size_t width = row_width(var);
    if (count > (body - pos) / (16 + width * 4)) bad("row count " + std::to_string(count) + " exceeds the file");
    rows[var].reserve(count);
    for (std::uint64_t r = 0; r < count; ++r) {
      const auto id = take(std::int64_t{});
      row_state rs;
      rs.updates = take(std::uint64_t{});
      rs.data.resize(width);
      need(width * 4);
      detail::get_array(in.data() + pos, rs.data.data(), width);
      pos += width * 4;
      rows[var].emplace(id, std::move(rs));
    }
  }
  const auto nw = take(std::uint32_t{});
  if (nw != workers_.size())
    bad("written for " + std::to_string(nw) + " workers, this PS has " + std::to_string(workers_.size()));
  std::vector<worker_state> workers(nw);
  for (worker_state& w : workers) {
    w.seen = take(std::uint8_t{}) != 0;
    w.incarnation = take(std::uint64_t{});
    w.last_seq = take(std::uint64_t{});
  }
  if (pos != body) bad(std::to_string(body - pos) + " unexpected bytes before the checksum");
  workers_ = std::move(workers);
  for (std::size_t i = 0; i < dense_.size(); ++i) {
    dense_state& d = dense_[i];
    d.updates = dense[i].updates;
    // A reply still sending the old values keeps them (a fresh buffer then).
    const std::span<float> w = writable_values(d, false);
    detail::get_array(in.data() + dense[i].at, w.data(), w.size());
    detail::get_array(in.data() + dense[i].at + w.size() * 4, d.slots.data(), d.slots.size());
  }
  rows_ = std::move(rows);
  global_step_ = step;
  restored_step_ = step;
  restored_ = true;
}

inline void shard::maybe_autosave() {
  if (opts_.checkpoint_every == 0 || opts_.checkpoint_dir.empty() || global_step_ % opts_.checkpoint_every != 0) return;
  try {
    save(checkpoint_file());
  } catch (const std::exception&) {
    ++stats_.errors;  // the next step tries again; a worker's explicit save reports the error
  }
}

inline std::uint64_t shard::fnv_bytes(std::span<const std::byte> b) noexcept {
  return fnv1a(std::string_view(reinterpret_cast<const char*>(b.data()), b.size()));
}

}  // namespace ps
}  // namespace v0
}  // namespace fusewire
