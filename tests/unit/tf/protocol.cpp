#include <fusewire/tf/protocol.hpp>
#include <fusewire/tf/tf.hpp>

#include <doctest/doctest.h>

#include <ostream>  // doctest prints std::error_code through it
#include <string>
#include <system_error>

#include "support/error_text.hpp"

namespace fg = fusewire::graph;
namespace tf = fusewire::tf;
using fusewire::errc;

TEST_CASE("protocol names map to partition modes") {
  CHECK(tf::parse_protocol("grpc") == tf::protocol::grpc);
  CHECK(tf::parse_protocol("grpc++") == tf::protocol::grpc_plus_plus);
  CHECK(tf::parse_protocol("star_server") == tf::protocol::star_server);
  CHECK(tf::parse_protocol("star_server_lite") == tf::protocol::star_server_lite);
  for (auto p :
       {tf::protocol::grpc, tf::protocol::grpc_plus_plus, tf::protocol::star_server, tf::protocol::star_server_lite})
    CHECK(tf::parse_protocol(tf::to_string(p)) == p);
  CHECK(tf::partition_mode_for(tf::protocol::grpc) == fg::partition_mode::send_recv);
  CHECK(tf::partition_mode_for(tf::protocol::grpc_plus_plus) == fg::partition_mode::send_recv);
  CHECK(tf::partition_mode_for(tf::protocol::star_server) == fg::partition_mode::star_server);
  CHECK(tf::partition_mode_for(tf::protocol::star_server_lite) == fg::partition_mode::star_server_lite);
}

TEST_CASE("unknown protocols and flags are refused with the allowed values") {
  CHECK(fusewire::test::error_of([] { tf::parse_protocol("GRPC++"); }, errc::invalid_config) ==
        "unknown protocol 'GRPC++' (allowed: grpc, grpc++, star_server, star_server_lite): invalid configuration");
  std::error_code ec;
  CHECK_FALSE(tf::parse_protocol("grpc+verbs", ec));
  CHECK(ec == errc::invalid_config);
  CHECK(tf::parse_protocol("grpc", ec) == tf::protocol::grpc);
  CHECK_FALSE(ec);

  // The same words as the TENSOR_FUSE environment knob.
  CHECK(tf::parse_flag("tensor_fuse", "True"));
  CHECK(tf::parse_flag("tensor_fuse", "1"));
  CHECK(tf::parse_flag("tensor_fuse", "on"));
  CHECK_FALSE(tf::parse_flag("tensor_fuse", "false"));
  CHECK_FALSE(tf::parse_flag("tensor_fuse", "No"));
  CHECK(fusewire::test::error_of([] { tf::parse_flag("tensor_fuse", "maybe"); }, errc::invalid_config) ==
        "tensor_fuse='maybe': expected a boolean (true/false, 1/0, yes/no, on/off): invalid configuration");
  CHECK(fusewire::test::error_of([] { tf::session_config::parse("star_server", "2"); }, errc::invalid_config) ==
        "tensor_fuse='2': expected a boolean (true/false, 1/0, yes/no, on/off): invalid configuration");
}

TEST_CASE("session_config turns into partition options") {
  auto c = tf::session_config::parse("grpc++", "True");
  CHECK(c.proto == tf::protocol::grpc_plus_plus);
  CHECK(c.tensor_fuse);
  auto o = c.partition_options();
  CHECK(o.mode == fg::partition_mode::send_recv);
  CHECK(o.tensor_fuse);
  CHECK(o.server_job == "ps");
  auto star = tf::session_config::parse("star_server").partition_options("parameter_server");
  CHECK(star.mode == fg::partition_mode::star_server);
  CHECK_FALSE(star.tensor_fuse);
  CHECK(star.server_job == "parameter_server");
}
