// Fashion-MNIST from IDX files, as Debian's dataset-fashion-mnist package
// installs them (gzip-compressed, read through zlib) or already unpacked.
#pragma once

#include <zlib.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

namespace example {

/// Where Debian's dataset-fashion-mnist package puts the files.
inline constexpr const char* default_fashion_mnist_dir = "/usr/share/datasets/fashion-mnist";

/// Images as floats in [0, 1] (row-major, `rows * cols` per image) and labels 0..9.
struct image_set {
  std::size_t count = 0;
  std::size_t pixels = 0;
  std::vector<float> images;
  std::vector<std::uint8_t> labels;
};

/// The training and test halves.
struct fashion_mnist {
  image_set train;
  image_set test;
};

namespace detail {

/// The whole file, gunzipped when it is gzip (zlib reads plain files through as they are).
inline std::vector<unsigned char> read_maybe_gz(const std::filesystem::path& file) {
  gzFile f = gzopen(file.c_str(), "rb");
  if (f == nullptr) throw std::runtime_error("cannot open " + file.string());
  std::vector<unsigned char> out;
  unsigned char chunk[1 << 16];
  for (;;) {
    const int n = gzread(f, chunk, sizeof chunk);
    if (n < 0) {
      int err = 0;
      const std::string msg = gzerror(f, &err);
      gzclose(f);
      throw std::runtime_error("cannot read " + file.string() + ": " + msg);
    }
    if (n == 0) break;
    out.insert(out.end(), chunk, chunk + n);
  }
  gzclose(f);
  return out;
}

inline std::uint32_t be32(const std::vector<unsigned char>& b, std::size_t at) {
  return (std::uint32_t{b[at]} << 24) | (std::uint32_t{b[at + 1]} << 16) | (std::uint32_t{b[at + 2]} << 8) |
         std::uint32_t{b[at + 3]};
}

/// `dir/name.gz` if it exists, else `dir/name`; throws naming both and the package.
inline std::filesystem::path find_idx(const std::filesystem::path& dir, const std::string& name) {
  for (const auto& candidate : {dir / (name + ".gz"), dir / name}) {
    std::error_code ec;
    if (std::filesystem::exists(candidate, ec)) return candidate;
  }
  throw std::runtime_error("Fashion-MNIST file " + (dir / (name + ".gz")).string() + " (or " + (dir / name).string() +
                           ") not found; install Debian's dataset-fashion-mnist package (apt-get install "
                           "dataset-fashion-mnist) or point --data at a directory with the IDX files");
}

inline image_set load_pair(const std::filesystem::path& dir, const std::string& images, const std::string& labels) {
  const auto ifile = find_idx(dir, images);
  const auto lfile = find_idx(dir, labels);
  const auto ib = read_maybe_gz(ifile);
  const auto lb = read_maybe_gz(lfile);
  if (ib.size() < 16 || be32(ib, 0) != 0x00000803) {
    throw std::runtime_error(ifile.string() + " is not an IDX image file (magic 0x00000803)");
  }
  if (lb.size() < 8 || be32(lb, 0) != 0x00000801) {
    throw std::runtime_error(lfile.string() + " is not an IDX label file (magic 0x00000801)");
  }
  image_set s;
  s.count = be32(ib, 4);
  s.pixels = std::size_t{be32(ib, 8)} * be32(ib, 12);
  if (be32(lb, 4) != s.count) throw std::runtime_error(ifile.string() + " and " + lfile.string() + " differ in count");
  if (ib.size() != 16 + s.count * s.pixels || lb.size() != 8 + s.count) {
    throw std::runtime_error(ifile.string() + " or " + lfile.string() + " is truncated");
  }
  s.images.resize(s.count * s.pixels);
  for (std::size_t i = 0; i < s.images.size(); ++i) s.images[i] = static_cast<float>(ib[16 + i]) / 255.0f;
  s.labels.assign(lb.begin() + 8, lb.end());
  for (std::uint8_t l : s.labels) {
    if (l > 9) throw std::runtime_error(lfile.string() + " has a label above 9");
  }
  return s;
}

}  // namespace detail

/// Loads both halves from `dir`; throws std::runtime_error naming the missing or bad file.
inline fashion_mnist load_fashion_mnist(const std::filesystem::path& dir) {
  fashion_mnist d;
  d.train = detail::load_pair(dir, "train-images-idx3-ubyte", "train-labels-idx1-ubyte");
  d.test = detail::load_pair(dir, "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte");
  return d;
}

}  // namespace example
