#include <fusewire/tf/rendezvous_key.hpp>

#include <doctest/doctest.h>

#include <fusewire/core/cluster_spec.hpp>
#include <fusewire/graph/partition.hpp>
#include <fusewire/graph/rendezvous_channel.hpp>

#include <ostream>  // doctest prints std::error_code through it
#include <string>
#include <system_error>

#include "support/error_text.hpp"

namespace fg = fusewire::graph;
namespace tf = fusewire::tf;
using fusewire::errc;

namespace {

std::string error_of(std::string_view key) {
  return fusewire::test::error_of([&] { tf::parse_rendezvous_key(key); }, errc::invalid_argument);
}

}  // namespace

TEST_CASE("a key TensorFlow wrote parses and rebuilds byte for byte") {
  const std::string key =
      "/job:worker/replica:0/task:0/device:CPU:0;0000000000000001;/job:ps/replica:0/task:0/device:CPU:0;edge_5_w;0:0";
  auto k = tf::parse_rendezvous_key(key);
  CHECK(k.src_device == "/job:worker/replica:0/task:0/device:CPU:0");
  CHECK(k.src_incarnation == 1u);
  CHECK(k.dst_device == "/job:ps/replica:0/task:0/device:CPU:0");
  CHECK(k.tensor_name == "edge_5_w");
  CHECK(k.frame_id == 0u);
  CHECK(k.iter_id == 0);
  CHECK(k.to_string() == key);
  CHECK(k.src_task() == fusewire::task_id{"worker", 0});
  CHECK(k.dst_task() == fusewire::task_id{"ps", 0});
  CHECK(k.dst().type == "CPU");
}

TEST_CASE("keys inside loops carry the frame id and iteration") {
  const std::string key =
      "/job:worker/replica:0/task:1/device:GPU:0;7f3a9c21b4e8d0aa;/job:ps/replica:0/task:3/device:CPU:0;"
      "rnn/while/MatMul/_12__cf__13;12257013012542591137:7";
  auto k = tf::parse_rendezvous_key(key);
  CHECK(k.src_incarnation == 0x7f3a9c21b4e8d0aaull);
  CHECK(k.tensor_name == "rnn/while/MatMul/_12__cf__13");
  CHECK(k.frame_id == 12257013012542591137ull);
  CHECK(k.iter_id == 7);
  CHECK(k.to_string() == key);
  CHECK(k.src_task() == fusewire::task_id{"worker", 1});
  CHECK(k.dst_task() == fusewire::task_id{"ps", 3});
  CHECK(tf::parse_rendezvous_key("/job:a/task:0;1;/job:b/task:0;t;0:-1").iter_id == -1);
}

TEST_CASE("make_rendezvous_key writes 16 lower-case hex digits") {
  CHECK(tf::make_rendezvous_key("/job:worker/replica:0/task:0/device:CPU:0", 1, "/job:ps/replica:0/task:0/device:CPU:0",
                                "edge_5_w") ==
        "/job:worker/replica:0/task:0/device:CPU:0;0000000000000001;/job:ps/replica:0/task:0/device:CPU:0;edge_5_w;"
        "0:0");
  CHECK(tf::make_rendezvous_key("/job:a/replica:0/task:0/cpu:0", 0xDEADBEEFCAFEull, "/job:b/replica:0/task:2/cpu:0",
                                "x", 99, 3) ==
        "/job:a/replica:0/task:0/cpu:0;0000deadbeefcafe;/job:b/replica:0/task:2/cpu:0;x;99:3");
  CHECK(tf::make_rendezvous_key("/job:a/task:0", ~0ull, "/job:b/task:0", "y") ==
        "/job:a/task:0;ffffffffffffffff;/job:b/task:0;y;0:0");
  // Upper-case and short incarnations parse (as in TensorFlow) and print canonically.
  auto k = tf::parse_rendezvous_key("/job:a/task:0;BEEF;/job:b/task:0;t;0:0");
  CHECK(k.src_incarnation == 0xbeefu);
  CHECK(k.to_string() == "/job:a/task:0;000000000000beef;/job:b/task:0;t;0:0");
}

TEST_CASE("the partitioner's keys are TensorFlow keys") {
  fg::graph_def g;
  g.tasks = {{"worker", 0}, {"ps", 1}};
  g.add("x", "Placeholder", {}, "/job:worker/replica:0/task:0");
  g.add("y", "Identity", {"x"}, "/job:ps/replica:0/task:1");
  auto p = fg::partition(fg::placed_graph(g));
  REQUIRE(p.messages.size() == 1);
  auto k = tf::parse_rendezvous_key(p.messages[0].key + ";0:0");
  CHECK(k.src_task() == p.messages[0].src);
  CHECK(k.dst_task() == p.messages[0].dst);
  CHECK(k.tensor_name == p.messages[0].name);
  CHECK(tf::route(k) == tf::rendezvous_route{p.messages[0].src, p.messages[0].dst, p.messages[0].key + ";0:0"});
}

TEST_CASE("a key routes between the tasks of its devices under its canonical text") {
  auto k = tf::parse_rendezvous_key("/job:worker/replica:0/task:2/device:GPU:1;BEEF;/job:ps/task:1/cpu:0;w/read;7:3");
  auto r = tf::route(k);
  CHECK(r.src == fusewire::task_id{"worker", 2});
  CHECK(r.dst == fusewire::task_id{"ps", 1});
  CHECK(r.channel_key == "/job:worker/replica:0/task:2/device:GPU:1;000000000000beef;/job:ps/task:1/cpu:0;w/read;7:3");
  // The sender writing lower-case hex reaches the same channel key.
  CHECK(tf::route(tf::parse_rendezvous_key(r.channel_key)) == r);
  CHECK(fusewire::test::error_of([] { tf::route(tf::parse_rendezvous_key("/job:worker;1;/job:ps/task:0;t;0:0")); },
                                 errc::invalid_argument) ==
        "device '/job:worker': it names no task; a task needs /job:<name> and /task:<index>: invalid argument");
}

TEST_CASE("bad keys name the bad part") {
  CHECK(error_of("/job:a/task:0;1;/job:b/task:0;t") ==
        "bad rendezvous key '/job:a/task:0;1;/job:b/task:0;t': it has 4 part(s); a key is "
        "src_device;src_incarnation;dst_device;tensor_name;frame_id:iter_id: invalid argument");
  CHECK(error_of("/job:a/task:0;1;/job:b/task:0;t;0:0;extra") ==
        "bad rendezvous key '/job:a/task:0;1;/job:b/task:0;t;0:0;extra': it has more than 5 parts (unexpected "
        "';extra'): invalid argument");
  CHECK(error_of(";1;/job:b/task:0;t;0:0") ==
        "bad rendezvous key ';1;/job:b/task:0;t;0:0': src_device is empty: invalid argument");
  CHECK(error_of("/job:a/replica:x;1;/job:b/task:0;t;0:0") ==
        "bad rendezvous key '/job:a/replica:x;1;/job:b/task:0;t;0:0': src_device '/job:a/replica:x': replica 'x' "
        "is not a number: invalid argument");
  CHECK(error_of("/job:a/task:0;12g4;/job:b/task:0;t;0:0") ==
        "bad rendezvous key '/job:a/task:0;12g4;/job:b/task:0;t;0:0': src_incarnation '12g4' is not 1 to 16 hex "
        "digits: invalid argument");
  CHECK(error_of("/job:a/task:0;00000000000000001;/job:b/task:0;t;0:0") ==
        "bad rendezvous key '/job:a/task:0;00000000000000001;/job:b/task:0;t;0:0': src_incarnation "
        "'00000000000000001' is not 1 to 16 hex digits: invalid argument");
  CHECK(error_of("/job:a/task:0;1;/job:b/tusk:0;t;0:0") ==
        "bad rendezvous key '/job:a/task:0;1;/job:b/tusk:0;t;0:0': dst_device '/job:b/tusk:0': unexpected "
        "'/tusk:0' (expected /job:, /replica:, /task:, /device:, /cpu: or /gpu:): invalid argument");
  CHECK(error_of("/job:a/task:0;1;/job:b/task:0;;0:0") ==
        "bad rendezvous key '/job:a/task:0;1;/job:b/task:0;;0:0': tensor_name is empty: invalid argument");
  CHECK(error_of("/job:a/task:0;1;/job:b/task:0;t;0") ==
        "bad rendezvous key '/job:a/task:0;1;/job:b/task:0;t;0': frame_id:iter_id '0' is not two numbers joined "
        "by ':': invalid argument");
  CHECK(error_of("/job:a/task:0;1;/job:b/task:0;t;-1:0") ==
        "bad rendezvous key '/job:a/task:0;1;/job:b/task:0;t;-1:0': frame_id '-1' is not an unsigned 64-bit "
        "number: invalid argument");
  CHECK(error_of("/job:a/task:0;1;/job:b/task:0;t;0:x") ==
        "bad rendezvous key '/job:a/task:0;1;/job:b/task:0;t;0:x': iter_id 'x' is not a signed 64-bit number: "
        "invalid argument");
  std::error_code ec;
  CHECK_FALSE(tf::parse_rendezvous_key("nonsense", ec));
  CHECK(ec == errc::invalid_argument);
  CHECK(tf::parse_rendezvous_key("/job:a/task:0;1;/job:b/task:0;t;0:0", ec));
  CHECK_FALSE(ec);
}

TEST_CASE("keys exactly as TensorFlow's Rendezvous::CreateKey writes them") {
  // A worker GPU sending to a PS CPU, outside any loop.
  const std::string gpu_to_ps =
      "/job:worker/replica:0/task:0/device:GPU:0;0000000000000001;/job:ps/replica:0/task:0/device:CPU:0;"
      "edge_5_foo;0:0";
  auto k = tf::parse_rendezvous_key(gpu_to_ps);
  CHECK(k.src_device == "/job:worker/replica:0/task:0/device:GPU:0");
  CHECK(k.src().type == "GPU");
  CHECK(k.src().id == 0);
  CHECK(k.src_incarnation == 1u);
  CHECK(k.dst_device == "/job:ps/replica:0/task:0/device:CPU:0");
  CHECK(k.tensor_name == "edge_5_foo");
  CHECK(k.frame_id == 0u);
  CHECK(k.iter_id == 0);
  CHECK(k.to_string() == gpu_to_ps);
  const auto r = tf::route(k);
  CHECK(r.src == fusewire::task_id{"worker", 0});
  CHECK(r.dst == fusewire::task_id{"ps", 0});
  CHECK(r.channel_key == gpu_to_ps);
  // The graph layer's channel routes the same key to the same tasks.
  std::error_code ec;
  auto g = fg::key_route(gpu_to_ps, ec);
  REQUIRE(g);
  CHECK(g->first == r.src);
  CHECK(g->second == r.dst);

  // A client-terminated fetch in a single-process session: the tensor name is
  // "node:port" (':' and '/' inside the name part), the incarnation a random fingerprint.
  const std::string fetch =
      "/job:localhost/replica:0/task:0/device:CPU:0;a1b2c3d4e5f60718;/job:localhost/replica:0/task:0/device:CPU:0;"
      "dense/MatMul:0;0:0";
  auto f = tf::parse_rendezvous_key(fetch);
  CHECK(f.tensor_name == "dense/MatMul:0");
  CHECK(f.src_incarnation == 0xa1b2c3d4e5f60718ull);
  CHECK(f.to_string() == fetch);
  CHECK(tf::route(f).src == fusewire::task_id{"localhost", 0});

  // TensorFlow's own test keys use the legacy "/CPU:0" device form and other replicas:
  // they parse; only routing refuses replicas other than 0 (a fusewire task is job + index).
  const std::string legacy =
      "/job:mnist/replica:1/task:2/CPU:0;0000000000001ed2;/job:mnist/replica:1/task:2/device:GPU:0;var0;0:0";
  auto l = tf::parse_rendezvous_key(legacy);
  CHECK(l.src_incarnation == 7890u);
  CHECK(l.src().type == "CPU");
  CHECK(l.src().replica == 1);
  CHECK(l.to_string() == legacy);
  CHECK(fusewire::test::error_of([&] { tf::route(l); }, errc::invalid_argument) ==
        "device '/job:mnist/replica:1/task:2/device:CPU:0': replica 1 is not supported (only replica 0): invalid "
        "argument");

  // make_rendezvous_key writes what CreateKey writes for the same parts.
  CHECK(tf::make_rendezvous_key("/job:worker/replica:0/task:0/device:GPU:0", 1, "/job:ps/replica:0/task:0/device:CPU:0",
                                "edge_5_foo", 0, 0) == gpu_to_ps);
}
