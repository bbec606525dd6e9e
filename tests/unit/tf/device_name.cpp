#include <fusewire/graph/device_name.hpp>
#include <fusewire/tf/rendezvous_key.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it
#include <string>
#include <system_error>

#include "support/error_text.hpp"

namespace tf = fusewire::tf;
using fusewire::errc;

namespace {

std::string error_of(std::string_view name) {
  return fusewire::test::error_of([&] { tf::parse_device_name(name); }, errc::invalid_argument);
}

std::string task_error_of(std::string_view name) {
  return fusewire::test::error_of([&] { tf::parse_device_name(name).task_id(); }, errc::invalid_argument);
}

}  // namespace

TEST_CASE("full, legacy and partial device names") {
  auto full = tf::parse_device_name("/job:worker/replica:0/task:3/device:GPU:1");
  CHECK(full.job == "worker");
  CHECK(full.replica == 0);
  CHECK(full.task == 3);
  CHECK(full.type == "GPU");
  CHECK(full.id == 1);
  CHECK(full.fully_specified());
  CHECK(full.to_string() == "/job:worker/replica:0/task:3/device:GPU:1");
  CHECK(full.task_id() == fusewire::task_id{"worker", 3});
  CHECK(tf::task_name(full.task_id()) == "/job:worker/replica:0/task:3");

  auto legacy = tf::parse_device_name("/job:ps/replica:0/task:1/cpu:0");
  CHECK(legacy.type == "CPU");
  CHECK(legacy.to_string() == "/job:ps/replica:0/task:1/device:CPU:0");
  CHECK(tf::parse_device_name("/job:ps/task:1/GPU:2").to_string() == "/job:ps/task:1/device:GPU:2");

  auto partial = tf::parse_device_name("/job:ps");
  CHECK(partial.job == "ps");
  CHECK_FALSE(partial.task);
  CHECK_FALSE(partial.fully_specified());

  auto wild = tf::parse_device_name("/job:*/replica:0/task:*/device:GPU:*");
  CHECK_FALSE(wild.job);
  CHECK_FALSE(wild.task);
  CHECK(wild.type == "GPU");
  CHECK_FALSE(wild.id);
  CHECK(wild.to_string() == "/replica:0/device:GPU:*");

  CHECK(tf::parse_device_name("/") == tf::device_name{});
  CHECK(tf::parse_device_name("") == tf::device_name{});
  CHECK(tf::parse_device_name("/device:CPU").to_string() == "/device:CPU:*");
}

TEST_CASE("task_id needs a job and a task") {
  CHECK(task_error_of("/job:ps/device:CPU:0") ==
        "device '/job:ps/device:CPU:0': it names no task; a task needs /job:<name> and /task:<index>: "
        "invalid argument");
  CHECK(task_error_of("/job:ps/replica:1/task:0") ==
        "device '/job:ps/replica:1/task:0': replica 1 is not supported (only replica 0): invalid argument");
  CHECK(task_error_of("/job:ps/replica:0/task:1/device:GPU:0") == "no error");
}

TEST_CASE("bad device names name the bad part") {
  CHECK(error_of("/job:1ps/task:0") ==
        "bad device name '/job:1ps/task:0': job name '1ps' must be a letter followed by letters, digits or '_': "
        "invalid argument");
  CHECK(error_of("/job:ps/task:x") == "bad device name '/job:ps/task:x': task 'x' is not a number: invalid argument");
  CHECK(error_of("/job:ps/task:99999999999") ==
        "bad device name '/job:ps/task:99999999999': task '99999999999' is out of range: invalid argument");
  CHECK(error_of("/job:ps/device:9PU:0") ==
        "bad device name '/job:ps/device:9PU:0': device type '9PU' must be a letter followed by letters, digits or "
        "'_': invalid argument");
  CHECK(error_of("/job:ps/device:CPU:z") ==
        "bad device name '/job:ps/device:CPU:z': device id 'z' is not a number: invalid argument");
  CHECK(error_of("/job:ps/job:worker") ==
        "bad device name '/job:ps/job:worker': it names the job twice: invalid argument");
  CHECK(error_of("job:ps") ==
        "bad device name 'job:ps': unexpected 'job:ps' (expected /job:, /replica:, /task:, /device:, /cpu: or "
        "/gpu:): invalid argument");
  std::error_code ec;
  std::string why;
  CHECK_FALSE(tf::parse_device_name("/task:", ec, &why));
  CHECK(ec == errc::invalid_argument);
  CHECK(why == "task '' is not a number");
  CHECK(tf::parse_device_name("/job:ps/task:2", ec));
  CHECK_FALSE(ec);
}
