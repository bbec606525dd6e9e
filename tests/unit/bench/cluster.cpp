#include "cluster.hpp"

#include <doctest/doctest.h>

#include "support/error_text.hpp"

using namespace fusewire::bench;
using fusewire::test::error_text_of;

TEST_CASE("a cluster spec lists PS endpoints and workers") {
  const cluster_spec c = parse_cluster("ps=10.0.0.1:50001,10.0.0.2:50002;worker=10.0.0.3:0");
  REQUIRE(c.ps.size() == 2);
  CHECK(c.ps[0] == endpoint{"10.0.0.1", 50001});
  CHECK(c.ps[1] == endpoint{"10.0.0.2", 50002});
  REQUIRE(c.workers.size() == 1);
  CHECK(c.workers[0] == endpoint{"10.0.0.3", 0});
  CHECK(c.to_string() == "ps=10.0.0.1:50001,10.0.0.2:50002;worker=10.0.0.3:0");
  CHECK(parse_cluster(c.to_string()) == c);
}

TEST_CASE("either order, host names and IPv6") {
  const cluster_spec c = parse_cluster("worker=a:1,b:2,c:3;ps=[::1]:5000");
  CHECK(c.workers.size() == 3);
  CHECK(c.ps[0] == endpoint{"::1", 5000});
  CHECK(c.ps[0].to_string() == "[::1]:5000");
  CHECK(parse_cluster(c.to_string()) == c);
}

TEST_CASE("bad specs say what is wrong") {
  CHECK(error_text_of([] { parse_cluster("ps=h:1"); }) ==
        "--cluster 'ps=h:1': no worker tasks (expected worker=host:port,...)");
  CHECK(error_text_of([] { parse_cluster("worker=h:1"); }) ==
        "--cluster 'worker=h:1': no ps tasks (expected ps=host:port,...)");
  CHECK(error_text_of([] { parse_cluster("ps=h:70000;worker=h:1"); }) ==
        "--cluster 'h:70000': the port must be a number from 0 to 65535");
  CHECK(error_text_of([] { parse_cluster("ps=h;worker=h:1"); }) == "--cluster 'h': expected host:port");
  CHECK(error_text_of([] { parse_cluster("ps=:5;worker=h:1"); }) == "--cluster ':5': the host is empty");
  CHECK(error_text_of([] { parse_cluster("ps=h:x;worker=h:1"); }) ==
        "--cluster 'h:x': the port must be a number from 0 to 65535");
  CHECK(error_text_of([] { parse_cluster("chief=h:1;ps=h:2;worker=h:3"); }) ==
        "--cluster 'chief=h:1;ps=h:2;worker=h:3': unknown job 'chief' (jobs are ps and worker)");
  CHECK(error_text_of([] { parse_cluster("ps=h:1;ps=h:2;worker=h:3"); }) ==
        "--cluster 'ps=h:1;ps=h:2;worker=h:3': 'ps' is given twice");
  CHECK(error_text_of([] { parse_cluster("h:1,h:2"); }) ==
        "--cluster 'h:1,h:2': expected ps=host:port,...;worker=host:port,...");
  CHECK(error_text_of([] { parse_cluster("ps=[::1:5;worker=h:1"); }) == "--cluster '[::1:5': expected [ipv6]:port");
  CHECK(error_text_of([] { parse_cluster("ps=h:1,;worker=h:1"); }) == "--cluster '': expected host:port");
}
