// pslite_bench: ps_bench's measurement written against ps-lite's public API
// (KVWorker/KVServer, ZPush/ZPull/ZPushPull with SArray), so that
// vs_pslite.sh can put the two side by side in the same shape. Not part of
// the meson build: ps-lite is not a Debian package; vs_pslite.sh builds it.
//
// One process per role, as ps-lite starts them (DMLC_ROLE = scheduler,
// server or worker; DMLC_NUM_SERVER, DMLC_NUM_WORKER, DMLC_PS_ROOT_URI,
// DMLC_PS_ROOT_PORT). A step of a worker is one request to every server:
// one key per server (the first key of its range), FLOATS values each, and
// the worker waits for it before the next. A server keeps one value array
// per key and applies SGD (lr 0.01) to a push, like ps_bench's PS.
//
//   pslite_bench FLOATS push|pull|both WARMUP_S TIME_S
//
// Each worker prints one line:
//   @pslite worker=R steps=N seconds=S rpcs=N*P p50_us=... p99_us=...
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "ps/ps.h"

namespace {

using clock_type = std::chrono::steady_clock;

struct store {
  std::mutex mutex;  // ps-lite calls the handle from its receive thread; one at a time anyway
  std::unordered_map<ps::Key, std::vector<float>> values;
};

void handle(store& st, std::size_t floats, const ps::KVMeta& meta, const ps::KVPairs<float>& req,
            ps::KVServer<float>* server) {
  std::lock_guard<std::mutex> lock(st.mutex);
  ps::KVPairs<float> res;
  if (meta.pull) {
    res.keys = req.keys;
    res.vals.resize(req.keys.size() * floats);
    res.lens.resize(req.keys.size());
  }
  for (std::size_t i = 0; i < req.keys.size(); ++i) {
    std::vector<float>& v = st.values[req.keys[i]];
    if (v.empty()) v.assign(floats, 0.5f);
    if (meta.push) {
      const float* g = req.vals.data() + i * floats;
      for (std::size_t e = 0; e < floats; ++e) v[e] -= 0.01f * g[e];
    }
    if (meta.pull) {
      std::memcpy(res.vals.data() + i * floats, v.data(), floats * sizeof(float));
      res.lens[i] = static_cast<int>(floats);
    }
  }
  server->Response(meta, res);
}

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

int run_worker(std::size_t floats, const std::string& op, double warmup_s, double time_s) {
  ps::KVWorker<float> kv(0, 0);
  const int num_ps = ps::NumServers();
  const auto& ranges = ps::Postoffice::Get()->GetServerKeyRanges();
  ps::SArray<ps::Key> keys(num_ps);
  ps::SArray<int> lens(num_ps);
  for (int p = 0; p < num_ps; ++p) {
    keys[p] = ranges[p].begin();
    lens[p] = static_cast<int>(floats);
  }
  ps::SArray<float> grads(static_cast<std::size_t>(num_ps) * floats, 1e-6f);
  ps::SArray<float> out;
  ps::SArray<int> out_lens;
  auto step = [&] {
    if (op == "push") {
      kv.Wait(kv.ZPush(keys, grads, lens));
    } else if (op == "pull") {
      kv.Wait(kv.ZPull(keys, &out, &out_lens));
    } else {
      kv.Wait(kv.ZPushPull(keys, grads, &out, &out_lens));
    }
  };
  const auto warm = clock_type::now();
  do step();
  while (since(warm) < warmup_s);
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup);
  std::vector<double> samples;
  samples.reserve(1 << 16);
  const auto start = clock_type::now();
  auto last = start;
  for (;;) {
    step();
    const auto now = clock_type::now();
    samples.push_back(std::chrono::duration<double, std::micro>(now - last).count());
    last = now;
    if (since(start) >= time_s) break;
  }
  const double seconds = std::chrono::duration<double>(last - start).count();
  std::sort(samples.begin(), samples.end());
  auto at = [&](double q) {
    std::size_t k = static_cast<std::size_t>(q * static_cast<double>(samples.size()) + 0.999999);
    k = std::min(std::max<std::size_t>(k, 1), samples.size()) - 1;
    return samples[k];
  };
  std::printf("@pslite worker=%d steps=%zu seconds=%.6f rpcs=%zu p50_us=%.3f p99_us=%.3f\n", ps::MyRank(),
              samples.size(), seconds, samples.size() * static_cast<std::size_t>(num_ps), at(0.5), at(0.99));
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 5) {
    std::fprintf(stderr, "usage: %s FLOATS push|pull|both WARMUP_S TIME_S (role from DMLC_ROLE)\n", argv[0]);
    return 2;
  }
  const long floats = std::atol(argv[1]);
  const std::string op = argv[2];
  if (floats <= 0 || (op != "push" && op != "pull" && op != "both")) {
    std::fprintf(stderr, "pslite_bench: bad FLOATS '%s' or op '%s' (push, pull or both)\n", argv[1], argv[2]);
    return 2;
  }
  const double warmup_s = std::atof(argv[3]), time_s = std::atof(argv[4]);
  // Start without the start-up barrier, register the server's handle, then
  // meet: otherwise a worker released first can send before the server's
  // KVServer exists, and the server's receive thread, waiting for it, holds
  // back the barrier release that would let it be made.
  ps::StartAsync(0, argv[0]);
  store st;
  ps::KVServer<float>* server = nullptr;
  if (ps::IsServer()) {
    server = new ps::KVServer<float>(0);
    server->set_request_handle([&st, floats](const ps::KVMeta& meta, const ps::KVPairs<float>& req,
                                             ps::KVServer<float>* srv) {
      handle(st, static_cast<std::size_t>(floats), meta, req, srv);
    });
  }
  ps::Postoffice::Get()->Barrier(0, ps::kWorkerGroup + ps::kServerGroup + ps::kScheduler);
  int rc = 0;
  if (ps::IsWorker()) rc = run_worker(static_cast<std::size_t>(floats), op, warmup_s, time_s);
  ps::Finalize(0, true);
  delete server;
  return rc;
}
