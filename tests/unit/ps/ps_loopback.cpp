// ps::server and ps::client in one process over loopback TCP (threads; also run under TSan).
#include <fusewire/ps/ps.hpp>
#include <fusewire/transport/asio_tcp.hpp>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <functional>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "support/loopback_cluster.hpp"
#include "support/reference_optimizer.hpp"

namespace ps_loopback_cases {

namespace fw = fusewire;
namespace ps = fusewire::ps;
using namespace std::chrono_literals;

namespace {

fw::options test_options() {
  fw::options o;
  o.mode = fw::reactor_mode::block;
  o.pool_size = 4u << 20;
  o.connect_timeout = 10000ms;
  return o;
}

ps::model_spec model() {
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(0.1f);
  m.min_slice_bytes = 64;
  m.add_dense("w", {10, 4}, ps::initializer::normal(0.0f, 1.0f, 3));  // 160 bytes: 2 slices
  m.add_dense("b", {4}, ps::initializer::constant(0.5f));
  m.add_embedding("emb", 4, ps::initializer::uniform(-1.0f, 1.0f, 5), 1000, ps::optimizer_config::adagrad(0.2f));
  return m;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::system_error& e) {
    return e.what();
  }
  return "(no exception)";
}

/// A server's log lines, kept for a test to look for (any thread).
class log_lines {
 public:
  fw::rendezvous::log_sink sink() {
    return [this](std::string_view l) {
      std::lock_guard lock(mu_);
      lines_.emplace_back(l);
    };
  }
  std::size_t count(const std::string& part) {
    std::lock_guard lock(mu_);
    return static_cast<std::size_t>(
        std::count_if(lines_.begin(), lines_.end(), [&](const std::string& l) { return l.find(part) != l.npos; }));
  }
  bool has(const std::string& part) { return count(part) != 0; }
  /// Up to 10 s for `n` lines holding `part`.
  bool wait_for(const std::string& part, std::size_t n = 1) {
    for (int i = 0; i < 2000 && count(part) < n; ++i) std::this_thread::sleep_for(5ms);
    return count(part) >= n;
  }

 private:
  std::mutex mu_;
  std::vector<std::string> lines_;
};

}  // namespace

TEST_CASE("loopback: 2 PS, 1 worker: fused pull/push of dense and sparse, errors, checkpoint, shutdown") {
  const auto spec = fw::test::loopback_cluster(2, 2);
  const auto m = model();
  const auto dir = std::filesystem::temp_directory_path() / ("fusewire_ps_loopback_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  // One lane each: the request counts and checkpoint names below are a PS's, not a lane's.
  ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m, {.options = test_options(), .checkpoint_dir = dir, .lanes = 1});
  ps::server<fw::asio_tcp> ps1({"ps", 1}, spec, m, {.options = test_options(), .checkpoint_dir = dir, .lanes = 1});
  const ps::client_config<fw::asio_tcp> co{.options = test_options(), .step_timeout = 20000ms};
  ps::client<fw::asio_tcp> cl({"worker", 0}, spec, m, co);

  // Initial values are the initializers', whichever PS holds them.
  const std::vector<std::int64_t> ids{5, 17, 5, 999, 0};
  ps::batch b;
  const auto hw = b.pull("w");
  const auto hb = b.pull("b");
  const auto he = b.pull_rows("emb", ids);
  cl.run(b);
  REQUIRE(b.result(hw).size() == 40);
  for (std::size_t i = 0; i < 40; ++i) CHECK(b.result(hw)[i] == m.variables[0].init.value("w", i / 4, i % 4));
  CHECK(std::vector<float>(b.result(hb).begin(), b.result(hb).end()) == std::vector<float>(4, 0.5f));
  REQUIRE(b.result(he).size() == 20);
  for (std::size_t k = 0; k < ids.size(); ++k) {
    for (std::size_t c = 0; c < 4; ++c) {
      CHECK(b.result(he)[k * 4 + c] == m.variables[2].init.value("emb", static_cast<std::uint64_t>(ids[k]), c));
    }
  }
  const std::vector<float> init_w(b.result(hw).begin(), b.result(hw).end());
  const std::vector<float> init_e(b.result(he).begin(), b.result(he).end());
  CHECK(cl.stats().requests == 2);  // one fused request per PS

  // Push and pull in one batch: pushes apply first.
  std::vector<float> gw(40), ge(20);
  for (std::size_t i = 0; i < 40; ++i) gw[i] = fw::test::grad_at(0, i);
  for (std::size_t i = 0; i < 20; ++i) ge[i] = 1.0f;
  b.clear();
  b.push("w", gw);
  b.push_rows("emb", ids, ge);
  const auto hw2 = b.pull("w");
  const auto he2 = b.pull_rows("emb", ids);
  cl.run(b);
  for (std::size_t i = 0; i < 40; ++i) CHECK(b.result(hw2)[i] == doctest::Approx(init_w[i] - 0.1f * gw[i]));
  // id 5 appears twice: gradient 2, adagrad: acc = 0.1 + 4, step 0.2 * 2 / sqrt(4.1)
  const float step5 = 0.2f * 2.0f / (std::sqrt(4.1f) + 1e-7f);
  const float step1 = 0.2f * 1.0f / (std::sqrt(1.1f) + 1e-7f);
  for (std::size_t c = 0; c < 4; ++c) {
    CHECK(b.result(he2)[0 * 4 + c] == doctest::Approx(init_e[0 * 4 + c] - step5));
    CHECK(b.result(he2)[2 * 4 + c] == doctest::Approx(init_e[2 * 4 + c] - step5));
    CHECK(b.result(he2)[1 * 4 + c] == doctest::Approx(init_e[1 * 4 + c] - step1));
    CHECK(b.result(he2)[3 * 4 + c] == doctest::Approx(init_e[3 * 4 + c] - step1));
  }
  CHECK(cl.global_step() == 1);

  // Unfused: one request per pull/push and PS, all in flight together; same semantics.
  {
    auto uo = co;
    uo.fuse = false;
    ps::client<fw::asio_tcp> unfused({"worker", 1}, spec, m, uo);
    b.clear();
    b.push("b", std::span<const float>(gw.data(), 4));
    const auto hb3 = b.pull("b");
    const auto hw3 = b.pull("w");
    const auto he3 = b.pull_rows("emb", ids);
    unfused.run(b);
    CHECK(unfused.stats().requests == 1 + 1 + 2 + 2);  // b: one slice; w: 2 slices; emb ids on both PS
    for (std::size_t i = 0; i < 4; ++i) CHECK(b.result(hb3)[i] == doctest::Approx(0.5f - 0.1f * gw[i]));
    std::vector<float> wv(b.result(hw3).begin(), b.result(hw3).end());
    for (std::size_t i = 0; i < 40; ++i) CHECK(wv[i] == doctest::Approx(init_w[i] - 0.1f * gw[i]));
    CHECK(b.result(he3).size() == 20);
    auto bad = uo;
    bad.mode = ps::training_mode::sync;
    CHECK(error_of([&] {
            ps::client<fw::asio_tcp> c({"worker", 1}, spec, m, bad);
          }) == "ps client: fuse = false needs async training (a sync step is one request per PS): invalid argument");
  }

  // Client-side checks name the variable.
  CHECK(error_of([&] { (void)cl.pull("nope"); }) ==
        "pull: unknown variable 'nope' (model has: w, b, emb): invalid argument");
  const std::vector<float> short_grad(3);
  CHECK(error_of([&] { cl.push("b", short_grad); }) ==
        "push of 'b': gradient has 3 values, the variable has 4: payload size does not match the destination");
  const std::vector<std::int64_t> bad_ids{1000};
  CHECK(error_of([&] { (void)cl.pull_rows("emb", bad_ids); }) ==
        "pull_rows of 'emb': id 1000 out of range [0, 1000): invalid argument");
  CHECK(error_of([&] { (void)cl.pull_rows("w", bad_ids); }) ==
        "pull_rows of 'w': the variable is dense (use pull/push): invalid argument");
  std::error_code ec;
  b.clear();
  b.pull("emb");
  cl.run(b, ec);
  CHECK(ec == fw::make_error_code(fw::errc::invalid_argument));
  CHECK(b.error_message() == "pull of 'emb': the variable is an embedding (use pull_rows/push_rows)");

  // A worker built from another model is refused by the PS.
  {
    auto other = m;
    other.optimizer.learning_rate = 0.2f;
    ps::client<fw::asio_tcp> stranger({"worker", 1}, spec, other, co);
    const std::string msg = error_of([&] { (void)stranger.pull("b"); });
    CHECK(msg.find("model fingerprint mismatch") != std::string::npos);
  }

  // Checkpoint on request, then shutdown.
  cl.save_checkpoint();
  CHECK(std::filesystem::exists(ps::checkpoint_path(dir, 0, 2)));
  CHECK(std::filesystem::exists(ps::checkpoint_path(dir, 1, 2)));
  cl.shutdown_servers();
  CHECK(ps0.wait_for(10s));
  CHECK(ps1.wait_for(10s));
  ps0.stop();
  ps1.stop();
  // the fused push step, plus the unfused client's push of 'b' on the PS that holds it
  CHECK(ps0.state().global_step() + ps1.state().global_step() == 3);
  std::filesystem::remove_all(dir);
}

TEST_CASE("handles, pull_into, gathered pushes, repeated ids summed on the worker, wait_ready") {
  const auto spec = fw::test::loopback_cluster(2, 1);
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(0.5f);
  m.min_slice_bytes = 64;
  // 2 x 16,384 floats: each PS's slice (64 KiB) is above the client's gather threshold.
  m.add_dense("big", {2, 16384}, ps::initializer::constant(1.0f));
  m.add_dense("small", {3}, ps::initializer::constant(2.0f));
  m.add_embedding("emb", 2, ps::initializer::constant(0.0f), 100);
  const ps::client_config<fw::asio_tcp> co{.options = test_options(), .step_timeout = 20000ms};

  // wait_ready names the PS tasks that do not answer.
  {
    ps::server<fw::asio_tcp> only0({"ps", 0}, spec, m, {.options = test_options()});
    ps::client<fw::asio_tcp> early({"worker", 0}, spec, m, co);
    std::error_code ec;
    std::string why;
    early.wait_ready(300ms, ec, why);
    CHECK(ec == fw::make_error_code(fw::errc::timed_out));
    CHECK(why.find("wait_ready: ps:1 did not answer within 300 ms") == 0);
    early.wait_ready(0ms, ec, why);
    CHECK(ec == fw::make_error_code(fw::errc::invalid_argument));
    CHECK(why == "wait_ready: timeout must be > 0 ms, got 0");
  }

  ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m, {.options = test_options()});
  ps::server<fw::asio_tcp> ps1({"ps", 1}, spec, m, {.options = test_options()});
  ps::client<fw::asio_tcp> cl({"worker", 0}, spec, m, co);
  cl.wait_ready(20s);
  const std::uint64_t ready_requests = cl.stats().requests;
  CHECK(ready_requests == 2);

  const ps::variable_handle big = cl.variable("big"), small = cl.variable("small"), emb = cl.variable("emb");
  CHECK(big.valid());
  CHECK(big.index() == 0);
  CHECK(big.size() == 32768);
  CHECK(small.size() == 3);
  CHECK(emb.kind() == ps::variable_kind::embedding);
  CHECK(emb.size() == 2);
  CHECK(error_of([&] { (void)cl.variable("nope"); }) ==
        "ps client: unknown variable 'nope' (model has: big, small, emb): invalid argument");

  // A large push goes from the caller's memory; values land in the caller's buffers.
  std::vector<float> grad(32768);
  for (std::size_t i = 0; i < grad.size(); ++i) grad[i] = static_cast<float>(i % 7);
  const std::vector<std::int64_t> ids{3, 8, 3, 41, 8, 3};  // repeats: summed before sending
  std::vector<float> grows(ids.size() * 2);
  for (std::size_t k = 0; k < ids.size(); ++k) grows[2 * k] = 1.0f, grows[2 * k + 1] = static_cast<float>(k);
  ps::batch b;
  b.push(big, grad);
  const std::vector<float> ones{1, 1, 1};  // must outlive run(): the step refers to it
  b.push(small, ones);
  b.push_rows(emb, ids, grows);
  const std::uint64_t sent_before = cl.stats().bytes_sent;
  cl.run(b);
  // Request bytes: three distinct ids, not six, crossed the wire for the rows.
  const std::uint64_t rows_bytes_max = 2 * (64 + 3 * 32) + 32768 * 4 + 3 * 4 + 3 * (8 + 2 * 4);
  CHECK(cl.stats().bytes_sent - sent_before <= rows_bytes_max);

  std::vector<float> big_out(32768, -1.0f), small_out(3, -1.0f), rows_out(ids.size() * 2, -1.0f);
  b.clear();
  b.pull_into(big, big_out);
  b.pull_into(small, small_out);
  b.pull_rows_into(emb, ids, rows_out);
  cl.run(b);
  for (std::size_t i = 0; i < big_out.size(); ++i) {
    if (big_out[i] != 1.0f - 0.5f * grad[i]) FAIL_CHECK("big[" << i << "] = " << big_out[i]);
  }
  CHECK(small_out == std::vector<float>{1.5f, 1.5f, 1.5f});
  // id 3 at positions 0, 2, 5: gradients (1,0) + (1,2) + (1,5); id 8 at 1, 4: (1,1) + (1,4); id 41: (1,3).
  auto row = [&](std::size_t k) { return std::vector<float>{rows_out[2 * k], rows_out[2 * k + 1]}; };
  CHECK(row(0) == std::vector<float>{-1.5f, -3.5f});
  CHECK(row(2) == row(0));
  CHECK(row(5) == row(0));
  CHECK(row(1) == std::vector<float>{-1.0f, -2.5f});
  CHECK(row(4) == row(1));
  CHECK(row(3) == std::vector<float>{-0.5f, -1.5f});

  // A large dense slice that ends a reply is received straight into its
  // destination (pull_into's, or the batch's own); what comes before it in
  // the reply (here: small, on one of the PS) is copied as usual.
  {
    std::vector<float> direct(32768, -1.0f), small2(3, -1.0f);
    b.clear();
    b.pull_into(small, small2);
    b.pull_into(big, direct);
    const std::uint64_t direct_before = cl.stats().direct_pulls;
    cl.run(b);
    CHECK(cl.stats().direct_pulls - direct_before == 2);  // one slice per PS
    CHECK(direct == big_out);
    CHECK(small2 == small_out);
    b.clear();
    const auto hb = b.pull(big);
    cl.run(b);
    CHECK(cl.stats().direct_pulls - direct_before == 4);
    CHECK(std::equal(b.result(hb).begin(), b.result(hb).end(), big_out.begin(), big_out.end()));
  }

  // Handles and names mix in one batch; a handle from another model is refused.
  b.clear();
  const auto hs = b.pull("small");
  b.pull_into(small, small_out);
  cl.run(b);
  CHECK(std::vector<float>(b.result(hs).begin(), b.result(hs).end()) == small_out);
  {
    auto other = m;
    other.add_dense("extra", {1});
    const auto s2 = fw::test::loopback_cluster(2, 1);
    ps::client<fw::asio_tcp> stranger({"worker", 0}, s2, other, co);
    const ps::variable_handle foreign = stranger.variable("small");
    b.clear();
    b.pull_into(foreign, small_out);
    std::error_code ec;
    cl.run(b, ec);
    CHECK(ec == fw::make_error_code(fw::errc::invalid_argument));
    CHECK(b.error_message() == "pull: a variable handle of another model or PS count");
    b.clear();
    b.pull(ps::variable_handle{});
    cl.run(b, ec);
    CHECK(b.error_message() == "pull: an empty variable handle (make handles with client::variable(name))");
  }
  // A destination of the wrong size fails the step before anything is sent.
  std::vector<float> wrong(4);
  b.clear();
  b.pull_into(small, wrong);
  std::error_code ec;
  const std::uint64_t requests = cl.stats().requests;
  cl.run(b, ec);
  CHECK(ec == fw::make_error_code(fw::errc::size_mismatch));
  CHECK(b.error_message() == "pull of 'small': the destination has 4 floats, the pull gives 3");
  CHECK(cl.stats().requests == requests);
  b.clear();
  b.pull_rows_into(emb, ids, wrong);
  cl.run(b, ec);
  CHECK(b.error_message() == "pull_rows of 'emb': the destination has 4 floats, the pull gives 12");
  cl.shutdown_servers();
}

TEST_CASE("lanes: PS tasks with more lanes than cores serve async and sync steps as one PS would") {
  const auto spec = fw::test::loopback_cluster(2, 2);
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(0.5f);
  m.min_slice_bytes = 64;
  m.add_dense("w", {12, 4}, ps::initializer::constant(1.0f));  // 192 bytes: 3 slices over 6 lanes
  m.add_dense("b", {4}, ps::initializer::constant(2.0f));
  m.add_embedding("emb", 2, ps::initializer::constant(0.0f), 1000);
  const auto dir = std::filesystem::temp_directory_path() / ("fusewire_ps_lanes_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  for (const ps::training_mode mode : {ps::training_mode::async, ps::training_mode::sync}) {
    CAPTURE(ps::to_string(mode));
    ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m,
                                 {.options = test_options(), .mode = mode, .checkpoint_dir = dir, .lanes = 3});
    ps::server<fw::asio_tcp> ps1({"ps", 1}, spec, m,
                                 {.options = test_options(), .mode = mode, .checkpoint_dir = dir, .lanes = 3});
    CHECK(ps0.lanes() == 3);
    const ps::client_config<fw::asio_tcp> co{.options = test_options(), .mode = mode, .step_timeout = 20000ms};
    ps::client<fw::asio_tcp> w0({"worker", 0}, spec, m, co), w1({"worker", 1}, spec, m, co);
    CHECK(w0.lanes() == 1);  // not asked yet
    w0.wait_ready(20s);
    CHECK(w0.lanes() == 3);
    CHECK(w0.place().num_ps() == 6);
    const auto w = w0.variable("w"), b = w0.variable("b"), emb = w0.variable("emb");
    std::vector<float> gw(48), gb(4, 1.0f), grows{1, 1, 2, 2, 3, 3};
    for (std::size_t i = 0; i < gw.size(); ++i) gw[i] = static_cast<float>(i % 5);
    const std::vector<std::int64_t> ids{7, 300, 999};
    // Both workers push once (sync: one step of their average; async: two steps).
    auto push = [&](ps::client<fw::asio_tcp>& c) {
      ps::batch s;
      s.push(w, gw);
      s.push(b, gb);
      s.push_rows(emb, ids, grows);
      c.run(s);
    };
    std::thread other([&] { push(w1); });
    push(w0);
    other.join();
    std::vector<float> wv(48), bv(4), rv(6);
    ps::batch s;
    s.pull_into(w, wv);
    s.pull_into(b, bv);
    s.pull_rows_into(emb, ids, rv);
    w0.run(s);
    const float times = mode == ps::training_mode::sync ? 1.0f : 2.0f;  // sync applies the average once
    for (std::size_t i = 0; i < wv.size(); ++i) CHECK(wv[i] == doctest::Approx(1.0f - 0.5f * times * gw[i]));
    CHECK(bv == std::vector<float>(4, 2.0f - 0.5f * times));
    for (std::size_t i = 0; i < rv.size(); ++i) CHECK(rv[i] == doctest::Approx(-0.5f * times * grows[i]));
    // Each slice lives on exactly one lane of one PS.
    w0.save_checkpoint();
    for (std::uint32_t v = 0; v < 6; ++v) CHECK(std::filesystem::exists(ps::checkpoint_path(dir, v, 6)));
    std::thread meet([&] { w1.barrier(20s); });
    w0.barrier(20s);  // kept by lane 0 of PS 0
    meet.join();
    w1.shutdown_servers();  // every lane answers before a server stops
    CHECK(ps0.wait_for(10s));
    CHECK(ps1.wait_for(10s));
    ps0.stop();
    ps1.stop();
    std::size_t slices = 0;
    for (ps::server<fw::asio_tcp>* srv : {&ps0, &ps1}) {
      for (std::uint32_t l = 0; l < 3; ++l) {
        for (std::uint32_t sl = 0; sl < 3; ++sl) slices += srv->state(l).dense_values(0, sl).empty() ? 0 : 1;
      }
    }
    CHECK(slices == 3);
    CHECK(ps0.global_step() == (mode == ps::training_mode::sync ? 1u : 2u));
    std::filesystem::remove_all(dir);
  }
}

TEST_CASE("lanes: workers on several reactors, small and large requests: each applied once, in order") {
  // One PS with four lanes, so four reactors with a worker each: small
  // requests run where they arrive, large pushes (a slice above 64 KiB) on
  // their lane's home reactor, sync replies are made on the last pusher's
  // reactor for every worker. Every gradient is 1/128 and the rate 0.5, so
  // every sum below is exact in float.
  constexpr unsigned workers = 4, steps = 30;
  constexpr float g = 1.0f / 128, lr = 0.5f;
  const auto spec = fw::test::loopback_cluster(1, workers);
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(lr);
  m.min_slice_bytes = 64;
  m.add_dense("w", {4, 20000}, ps::initializer::constant(1.0f));  // a slice of 80,000 bytes per lane
  m.add_dense("b", {8}, ps::initializer::constant(1.0f));
  for (const ps::training_mode mode : {ps::training_mode::async, ps::training_mode::sync}) {
    CAPTURE(ps::to_string(mode));
    const bool sync = mode == ps::training_mode::sync;
    ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m, {.options = test_options(), .mode = mode, .lanes = 4});
    REQUIRE(ps0.lanes() == 4);
    std::vector<std::unique_ptr<ps::client<fw::asio_tcp>>> cs;
    for (unsigned i = 0; i < workers; ++i) {
      // async: one request per push and pull, all in flight at once (a pull
      // right behind a large push of the same slice on the same lane).
      cs.push_back(std::make_unique<ps::client<fw::asio_tcp>>(
          fw::task_id{"worker", i}, spec, m,
          ps::client_config<fw::asio_tcp>{
              .options = test_options(), .mode = mode, .step_timeout = 20000ms, .fuse = sync}));
    }
    CHECK(ps0.endpoint().reactors() == 4);
    std::vector<std::string> failures(workers);
    std::vector<std::thread> ts;
    for (unsigned i = 0; i < workers; ++i) {
      ts.emplace_back([&, i] {
        ps::client<fw::asio_tcp>& c = *cs[i];
        const auto w = c.variable("w"), b = c.variable("b");
        const std::vector<float> gw(80000, g), gb(8, g);
        std::vector<float> wv(80000), bv(8);
        for (unsigned k = 1; k <= steps; ++k) {
          ps::batch s;
          s.push(w, gw);
          s.push(b, gb);
          s.pull_into(w, wv);
          s.pull_into(b, bv);
          std::error_code ec;
          c.run(s, ec);
          if (ec) {
            failures[i] = "step " + std::to_string(k) + ": " + s.error_message();
            return;
          }
          // This worker's own k pushes are in (the others' may be too).
          const float most = 1.0f - lr * g * static_cast<float>(k);
          for (std::size_t j = 0; j < wv.size(); j += 4999) {
            if (wv[j] > most)
              failures[i] = "step " + std::to_string(k) + ": w[" + std::to_string(j) + "] = " + std::to_string(wv[j]) +
                            ", above " + std::to_string(most);
          }
          if (bv[0] > most) failures[i] = "step " + std::to_string(k) + ": b = " + std::to_string(bv[0]);
          if (!failures[i].empty()) return;
        }
      });
    }
    for (auto& t : ts) t.join();
    for (unsigned i = 0; i < workers; ++i) CHECK_MESSAGE(failures[i].empty(), "worker ", i, ": ", failures[i]);
    // Every push applied exactly once: async one step per push, sync one
    // step of the four workers' average per step.
    const float pushes = sync ? static_cast<float>(steps) : static_cast<float>(steps * workers);
    std::vector<float> wv(80000), bv(8);
    ps::batch s;
    s.pull_into(cs[0]->variable("w"), wv);
    s.pull_into(cs[0]->variable("b"), bv);
    cs[0]->run(s);
    CHECK(wv.front() == 1.0f - lr * g * pushes);
    CHECK(wv.back() == 1.0f - lr * g * pushes);
    CHECK(bv == std::vector<float>(8, 1.0f - lr * g * pushes));
    if (sync) CHECK(ps0.global_step() == steps);
    cs[0]->shutdown_servers();
    CHECK(ps0.wait_for(10s));
  }
}

TEST_CASE("lanes: a worker refuses PS tasks that run different lane counts") {
  const auto spec = fw::test::loopback_cluster(2, 1);
  const auto m = model();
  ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m, {.options = test_options(), .lanes = 2});
  ps::server<fw::asio_tcp> ps1({"ps", 1}, spec, m, {.options = test_options(), .lanes = 3});
  ps::client<fw::asio_tcp> cl({"worker", 0}, spec, m, {.options = test_options(), .step_timeout = 20000ms});
  CHECK(error_of([&] { (void)cl.pull("b"); }) ==
        "the PS tasks run different lane counts (ps:0: 2, ps:1: 3): every PS of a job needs the same "
        "server_config::lanes (NETWORK_PS_CORE_NUMBER): invalid argument");
  CHECK(error_of([&] {
          ps::server<fw::asio_tcp> bad({"ps", 0}, fw::test::loopback_cluster(1, 1), m,
                                       {.options = test_options(), .lanes = 300});
        }) == "ps server: lanes = 300 (allowed: 1 to 256, 0 = automatic): invalid argument");
  ps0.stop();
  ps1.stop();
}

TEST_CASE("a worker that closes its client left; one whose connection breaks is named so") {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const auto m = model();
  log_lines log;
  ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m, {.options = test_options(), .lanes = 2, .log = log.sink()});
  // worker:0 steps and destroys its client: a bye first, so the PS says it left.
  {
    ps::client<fw::asio_tcp> w({"worker", 0}, spec, m, {.options = test_options(), .step_timeout = 20000ms});
    (void)w.pull("b");
  }
  CHECK(log.wait_for("ps server: worker:0 left (it closed its client)"));
  CHECK_FALSE(log.has("worker:0 lost"));
  // worker:1's endpoint goes without a client's bye (as when its process
  // dies): the PS says its connection broke, and why (it is lost when it
  // stays away for reconnect_grace).
  {
    ps::client<fw::asio_tcp> w({"worker", 1}, spec, m, {.options = test_options(), .step_timeout = 20000ms});
    (void)w.pull("b");
    w.endpoint().close();
  }
  CHECK(log.wait_for("ps server: worker:1's connection broke ("));
  CHECK_FALSE(log.has("worker:1 left"));
  // A worker that left and comes back is served, and its next end is a departure again.
  {
    ps::client<fw::asio_tcp> w({"worker", 0}, spec, m, {.options = test_options(), .step_timeout = 20000ms});
    CHECK(w.pull("b").size() == 4);
  }
  CHECK(log.wait_for("worker:0 left", 2));
  CHECK(log.count("worker:0 left") == 2);
  CHECK(log.count("worker:0 lost") == 0);
  ps0.stop();
}

TEST_CASE("sync: a worker whose connection breaks has reconnect_grace to come back before the step fails") {
  const auto spec = fw::test::loopback_cluster(1, 2);
  const auto m = model();
  log_lines log;
  ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m,
                               {.options = test_options(),
                                .mode = ps::training_mode::sync,
                                .reconnect_grace = 3000ms,
                                .lanes = 2,
                                .log = log.sink()});
  const ps::client_config<fw::asio_tcp> co{
      .options = test_options(), .mode = ps::training_mode::sync, .step_timeout = 20000ms};
  const std::vector<float> gb(4, 1.0f);
  auto step = [&](ps::client<fw::asio_tcp>& c, std::error_code& ec) {
    ps::batch s;
    s.push("b", gb);
    c.run(s, ec);
    return s.error_message();
  };
  ps::client<fw::asio_tcp> w0({"worker", 0}, spec, m, co);
  std::error_code ec0, ec1;
  {
    ps::client<fw::asio_tcp> w1({"worker", 1}, spec, m, co);
    std::thread other([&] { step(w1, ec1); });
    step(w0, ec0);
    other.join();
    CHECK_FALSE(ec0);
    CHECK_FALSE(ec1);
    // worker:1's connections end without a bye (as when a lossy link breaks
    // them, or its process is restarted at once).
    w1.endpoint().close();
    CHECK(log.wait_for("ps server: worker:1's connection broke ("));
  }
  // worker:0's next step waits for worker:1, which comes back within the grace.
  std::thread waiting([&] { step(w0, ec0); });
  std::this_thread::sleep_for(200ms);
  {
    ps::client<fw::asio_tcp> w1({"worker", 1}, spec, m, co);
    step(w1, ec1);
    waiting.join();
    CHECK_FALSE(ec0);
    CHECK_FALSE(ec1);
    CHECK(log.wait_for("ps server: worker:1 is back, "));
    CHECK_FALSE(log.has("worker:1 lost"));
    CHECK(ps0.global_step() == 2);
    w1.endpoint().close();
  }
  // This time it stays away: the step fails once the grace is over, naming it.
  CHECK(error_of([&] {
          ps::server<fw::asio_tcp> bad({"ps", 0}, fw::test::loopback_cluster(1, 1), m,
                                       {.options = test_options(), .reconnect_grace = -1ms});
        }) == "ps server: reconnect_grace = -1 ms (allowed: 0 = none, or more): invalid argument");
  const std::string why = step(w0, ec0);
  CHECK(ec0 == fw::make_error_code(fw::errc::peer_lost));
  CHECK(why.find("worker:1 was lost (connection closed; no request from it for 3000 ms") != std::string::npos);
  CHECK(log.wait_for("ps server: worker:1 lost: "));
  ps0.stop();
}

TEST_CASE("a trace of a 3-step PS run parses as JSON and holds the expected spans") {
  const auto spec = fw::test::loopback_cluster(1, 1);
  const auto m = model();
  const auto dir = std::filesystem::temp_directory_path() / ("fusewire_ps_trace_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  fw::options o = test_options();
  o.trace_file = (dir / "{task}.json").string();
  {
    ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m, {.options = o});
    ps::client<fw::asio_tcp> cl({"worker", 0}, spec, m, {.options = o, .step_timeout = 20000ms});
    const std::vector<float> grad(4, 1.0f);  // a batch keeps a span of it until run()
    for (int step = 0; step < 3; ++step) {
      ps::batch b;
      (void)b.pull("w");
      b.push("b", grad);
      cl.run(b);
    }
    cl.shutdown_servers();
    ps0.wait();
  }  // destroyed: each writes its trace
  auto load = [&](const char* name) {
    std::ifstream f(dir / name);
    REQUIRE_MESSAGE(f.good(), "no trace file " << name);
    return nlohmann::json::parse(f);  // throws (fails the test) unless it is JSON
  };
  const auto worker = load("worker-0.json");
  const auto ps = load("ps-0.json");
  CHECK(worker["otherData"]["task"] == "worker:0");
  CHECK(worker["otherData"]["dropped_events"] == 0);
  CHECK(worker["otherData"].contains("steady_to_wall_us"));
  std::map<int, std::string> names;  // track id -> name
  for (const auto& e : worker["traceEvents"]) {
    if (e["ph"] == "M" && e["name"] == "thread_name") names[e["tid"].get<int>()] = e["args"]["name"];
  }
  CHECK(std::ranges::count_if(names, [](const auto& n) { return n.second == "steps"; }) == 1);
  int steps = 0, requests = 0, replies = 0, served = 0;
  double last_step_end = 0;
  for (const auto& e : worker["traceEvents"]) {
    if (e["ph"] != "X") continue;
    CHECK(e["dur"].get<double>() >= 0);
    if (e["cat"] == "mark") {
      CHECK(e["args"]["detail"] == "requests to ps:0");
      if (e["name"] == "ps control") continue;  // shutdown_servers()
      CHECK(e["name"] == "ps step");
      CHECK(e["ts"].get<double>() >= last_step_end);  // one after the other
      last_step_end = e["ts"].get<double>() + e["dur"].get<double>();
      ++steps;
    } else if (e["cat"] == "send" && e["args"]["key"] == "fusewire.ps/req") {
      CHECK(e["args"]["peer"] == "ps:0");
      CHECK(e["args"]["bytes"].get<std::uint64_t>() > 0);
      CHECK(names.at(e["tid"].get<int>()) == "reactor 0: send to ps:0");  // its reactor's track to that peer
      ++requests;
    } else if (e["cat"] == "recv" && e["args"]["key"] == "fusewire.ps/rep" && e["args"]["ok"] == true) {
      ++replies;
    }
  }
  CHECK(steps == 3);
  CHECK(requests == 5);  // the hello (how many lanes), 3 steps and the shutdown
  CHECK(replies == 5);
  for (const auto& e : ps["traceEvents"]) {
    if (e["ph"] == "X" && e["cat"] == "recv" && e["args"]["key"] == "fusewire.ps/req" && e["args"]["ok"] == true) {
      CHECK(e["args"]["peer"] == "worker:0");
      ++served;
    }
  }
  CHECK(served == 5);
  std::filesystem::remove_all(dir);
}

TEST_CASE("loopback: large slices leave the PS without a copy; a pull sees each slice all before or all after a push") {
  const auto spec = fw::test::loopback_cluster(2, 2);
  ps::model_spec m;
  m.optimizer = ps::optimizer_config::sgd(0.125f);
  m.min_slice_bytes = 128 * 1024;
  m.add_dense("big", {256, 1024}, ps::initializer::constant(1.0f));  // 1 MiB: a slice per PS lane
  m.add_dense("b", {4}, ps::initializer::constant(0.5f));
  // The default lanes: one per worker, so two per PS and a slice of 256 KiB each.
  ps::server<fw::asio_tcp> ps0({"ps", 0}, spec, m, {.options = test_options()});
  ps::server<fw::asio_tcp> ps1({"ps", 1}, spec, m, {.options = test_options()});
  REQUIRE(ps0.lanes() == 2);
  const ps::client_config<fw::asio_tcp> co{.options = test_options(), .step_timeout = 20000ms};
  ps::client<fw::asio_tcp> pusher({"worker", 0}, spec, m, co);
  ps::client<fw::asio_tcp> puller({"worker", 1}, spec, m, co);
  constexpr int steps = 16;
  constexpr std::size_t slices = 4, slice_floats = 256 * 1024 / slices;
  const std::vector<float> g(256 * 1024, 1.0f);  // every value moves alike: a torn slice would not be uniform

  std::thread push_thread([&] {
    ps::batch b;
    for (int i = 0; i < steps; ++i) {
      b.clear();
      b.push("big", g);
      pusher.run(b);
    }
  });
  std::vector<std::string> torn;
  float previous[slices] = {1.0f, 1.0f, 1.0f, 1.0f};  // per slice: a pull never sees an older state than the one before
  ps::batch b;
  for (int i = 0; i < steps; ++i) {
    b.clear();
    const auto hbig = b.pull("big");
    const auto hb = b.pull("b");
    puller.run(b);
    const auto v = b.result(hbig);
    REQUIRE(v.size() == 256 * 1024);
    CHECK(std::vector<float>(b.result(hb).begin(), b.result(hb).end()) == std::vector<float>(4, 0.5f));
    for (std::size_t k = 0; k < slices; ++k) {  // one slice per PS lane: each must be one step's values
      const auto slice = v.subspan(k * slice_floats, slice_floats);
      if (std::adjacent_find(slice.begin(), slice.end(), std::not_equal_to<>()) != slice.end()) {
        torn.push_back("pull " + std::to_string(i) + ", slice " + std::to_string(k));
      }
      // Values only go down: exactly k pushes of 1.0 at lr 1/8 (exact in float).
      const float pushes = (1.0f - slice[0]) * 8.0f;
      CHECK(pushes == std::floor(pushes));
      CHECK(pushes <= static_cast<float>(steps));
      CHECK(slice[0] <= previous[k]);
      previous[k] = slice[0];
    }
  }
  push_thread.join();
  CHECK(torn.empty());
  CHECK(puller.place().slices(0).size() == slices);
  b.clear();
  const auto hbig = b.pull("big");
  puller.run(b);
  const auto final_values = b.result(hbig);
  CHECK(std::all_of(final_values.begin(), final_values.end(), [](float x) { return x == 1.0f - 0.125f * steps; }));
  // A reply that ends in its slice of "big" was received straight into the
  // batch: three of the four lanes' (the one that holds b too ends in b's values).
  CHECK(puller.stats().direct_pulls >= (steps + 1) * 3);
  ps0.stop();
  ps1.stop();
  std::uint64_t shared = 0, cow = 0;
  for (ps::server<fw::asio_tcp>* srv : {&ps0, &ps1}) {
    for (std::uint32_t l = 0; l < srv->lanes(); ++l) {
      shared += srv->state(l).stats().shared_reply_bytes;
      cow += srv->state(l).stats().cow_copies;
    }
  }
  CHECK(shared == (steps + 1) * 256 * 1024 * 4);  // every pull of "big", no byte of it copied
  MESSAGE("copy-on-write copies: ", cow);
}

}  // namespace ps_loopback_cases
