// Checks the soft-RoCE guest that tests/qemu/run.sh boots, through libibverbs:
// the device the rdma suite relies on exists, its port is active, GID index 1
// is the IPv4-mapped address of rxenet0, and PD, CQ, MR and an RC QP can be
// created. Exits 77 (skip) when there is no RDMA device at all, unless
// FUSEWIRE_RDMA_REQUIRED=1 (set by run-rdma-tests.sh inside the guest).
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <infiniband/verbs.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

namespace {

std::string wanted_device() {
  const char* name = std::getenv("FUSEWIRE_RDMA_TEST_DEV");
  return name != nullptr && *name != '\0' ? name : "rxe0";
}

struct device_list {
  int count = 0;
  ibv_device** list = ibv_get_device_list(&count);
  device_list() = default;
  device_list(const device_list&) = delete;
  device_list& operator=(const device_list&) = delete;
  ~device_list() {
    if (list != nullptr) ibv_free_device_list(list);
  }
};

struct context_closer {
  void operator()(ibv_context* c) const { ibv_close_device(c); }
};
struct pd_closer {
  void operator()(ibv_pd* p) const { ibv_dealloc_pd(p); }
};
struct cq_closer {
  void operator()(ibv_cq* c) const { ibv_destroy_cq(c); }
};
struct mr_closer {
  void operator()(ibv_mr* m) const { ibv_dereg_mr(m); }
};
struct qp_closer {
  void operator()(ibv_qp* q) const { ibv_destroy_qp(q); }
};

std::unique_ptr<ibv_context, context_closer> open_wanted() {
  device_list devices;
  REQUIRE(devices.list != nullptr);
  for (int i = 0; i < devices.count; ++i) {
    if (wanted_device() == ibv_get_device_name(devices.list[i])) {
      return std::unique_ptr<ibv_context, context_closer>(ibv_open_device(devices.list[i]));
    }
  }
  FAIL("device " << wanted_device() << " not found among " << devices.count << " RDMA devices");
  return nullptr;
}

}  // namespace

TEST_CASE("rxe device: port 1 is active Ethernet (RoCE) with the IPv4-mapped GID at index 1") {
  auto ctx = open_wanted();
  REQUIRE(ctx != nullptr);
  ibv_device_attr dev{};
  REQUIRE(ibv_query_device(ctx.get(), &dev) == 0);
  CHECK(dev.phys_port_cnt == 1);
  CHECK(dev.max_qp_wr > 0);

  ibv_port_attr port{};
  REQUIRE(ibv_query_port(ctx.get(), 1, &port) == 0);
  CHECK(port.state == IBV_PORT_ACTIVE);
  CHECK(port.link_layer == IBV_LINK_LAYER_ETHERNET);

  ibv_gid gid{};
  REQUIRE(ibv_query_gid(ctx.get(), 1, 1, &gid) == 0);
  const std::array<unsigned char, 16> mapped{0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 192, 0, 2, 1};
  CHECK(std::memcmp(gid.raw, mapped.data(), mapped.size()) == 0);
}

TEST_CASE("rxe device: PD, CQ, MR and an RC QP can be created; the MR keys are usable") {
  auto ctx = open_wanted();
  REQUIRE(ctx != nullptr);
  std::unique_ptr<ibv_pd, pd_closer> pd(ibv_alloc_pd(ctx.get()));
  REQUIRE(pd != nullptr);
  std::unique_ptr<ibv_cq, cq_closer> cq(ibv_create_cq(ctx.get(), 64, nullptr, nullptr, 0));
  REQUIRE(cq != nullptr);

  std::vector<unsigned char> buffer(1 << 20, 0x5a);
  const int access = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
  std::unique_ptr<ibv_mr, mr_closer> mr(ibv_reg_mr(pd.get(), buffer.data(), buffer.size(), access));
  REQUIRE(mr != nullptr);
  CHECK(mr->addr == buffer.data());
  CHECK(mr->length == buffer.size());
  CHECK(mr->lkey != 0);

  ibv_qp_init_attr init{};
  init.send_cq = cq.get();
  init.recv_cq = cq.get();
  init.qp_type = IBV_QPT_RC;
  init.cap.max_send_wr = 16;
  init.cap.max_recv_wr = 16;
  init.cap.max_send_sge = 4;
  init.cap.max_recv_sge = 4;
  std::unique_ptr<ibv_qp, qp_closer> qp(ibv_create_qp(pd.get(), &init));
  REQUIRE(qp != nullptr);
  CHECK(qp->qp_num != 0);

  ibv_qp_attr attr{};
  attr.qp_state = IBV_QPS_INIT;
  attr.pkey_index = 0;
  attr.port_num = 1;
  attr.qp_access_flags = access;
  CHECK(ibv_modify_qp(qp.get(), &attr, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
}

int main(int argc, char** argv) {
  {
    device_list devices;
    if (devices.list == nullptr || devices.count == 0) {
      const char* required = std::getenv("FUSEWIRE_RDMA_REQUIRED");
      if (required != nullptr && std::string(required) == "1") {
        std::fprintf(stderr, "rxe_device: no RDMA device, but FUSEWIRE_RDMA_REQUIRED=1\n");
        return 1;
      }
      std::printf("SKIP: no RDMA device here (run inside the guest: tests/qemu/run-rdma-tests.sh)\n");
      return 77;
    }
  }
  doctest::Context context(argc, argv);
  return context.run();
}
