#include <fusewire/graph/channel.hpp>

#include <doctest/doctest.h>

#include <fusewire/core/tensor_buffer.hpp>
#include <fusewire/core/tensor_descriptor.hpp>

#include <cstddef>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

namespace channel_cases {

namespace fg = fusewire::graph;
using fusewire::errc;

namespace {

struct received {
  int calls = 0;
  std::error_code ec;
  fg::payload values;
  fg::recv_handler handler() {
    return [this](std::error_code e, fg::payload p) {
      ++calls;
      ec = e;
      values = std::move(p);
    };
  }
};

fg::payload one(float v) {
  fg::payload p;
  p.push_back(fg::message_entry::of(fg::tensor({1}, {v})));
  return p;
}

// The tensor entry `k` of `p` holds.
fg::tensor tensor_in(const fg::payload& p, std::size_t k) {
  fg::tensor t;
  REQUIRE(k < p.size());
  REQUIRE_FALSE(p[k].to_tensor(t));
  return t;
}

}  // namespace

TEST_CASE("tensor checks its value count") {
  CHECK(fg::tensor({2, 3}, std::vector<float>(6, 1.0f)).element_count() == 6u);
  CHECK(fg::tensor::scalar(2.5f).to_string() == "[]{2.5}");
  CHECK(fg::tensor({2}, {1, 2}).byte_size() == 8u);
  try {
    fg::tensor({2, 3}, {1, 2});
    FAIL("expected an error");
  } catch (const std::system_error& e) {
    CHECK(e.code() == errc::invalid_argument);
    CHECK(std::string(e.what()) == "tensor of shape [2,3] needs 6 values, got 2: invalid argument");
  }
}

TEST_CASE("local_channel matches a send with its receive in either order") {
  fg::local_channel ch;
  received a, b;
  CHECK_FALSE(ch.send(1, "k1", one(1)));
  ch.async_recv(1, "k1", a.handler());
  CHECK(a.calls == 1);
  CHECK_FALSE(a.ec);
  REQUIRE(a.values.size() == 1);
  CHECK(tensor_in(a.values, 0).values[0] == 1.0f);

  ch.async_recv(1, "k2", b.handler());
  CHECK(b.calls == 0);
  CHECK_FALSE(ch.send(1, "k2", one(2)));
  CHECK(b.calls == 1);
  CHECK(tensor_in(b.values, 0).values[0] == 2.0f);
  CHECK(ch.unmatched(1).empty());
}

TEST_CASE("steps keep their keys apart") {
  fg::local_channel ch;
  received a, b;
  CHECK_FALSE(ch.send(1, "k", one(1)));
  CHECK_FALSE(ch.send(2, "k", one(2)));
  ch.async_recv(2, "k", b.handler());
  ch.async_recv(1, "k", a.handler());
  CHECK(tensor_in(a.values, 0).values[0] == 1.0f);
  CHECK(tensor_in(b.values, 0).values[0] == 2.0f);
}

TEST_CASE("duplicate keys are refused") {
  fg::local_channel ch;
  CHECK_FALSE(ch.send(1, "k", one(1)));
  CHECK(ch.send(1, "k", one(2)) == errc::duplicate_key);
  received a, b;
  ch.async_recv(1, "k", a.handler());
  ch.async_recv(1, "k", b.handler());
  CHECK(a.calls == 1);
  CHECK_FALSE(a.ec);
  CHECK(b.calls == 1);
  CHECK(b.ec == errc::duplicate_key);
}

TEST_CASE("cancel fails waiting receives once and refuses later traffic") {
  fg::local_channel ch;
  received a, b;
  ch.async_recv(3, "waiting", a.handler());
  CHECK_FALSE(ch.send(3, "queued", one(1)));
  CHECK(ch.unmatched(3) == std::vector<std::string>{"sent, never received: queued", "awaited, never sent: waiting"});
  ch.cancel(3);
  CHECK(a.calls == 1);
  CHECK(a.ec == errc::cancelled);
  CHECK(ch.send(3, "waiting", one(1)) == errc::cancelled);
  ch.async_recv(3, "queued", b.handler());
  CHECK(b.ec == errc::cancelled);
  CHECK(a.calls == 1);
  CHECK(ch.unmatched(3).empty());
}

TEST_CASE("message entries carry a core descriptor and a tensor_buffer") {
  auto e = fg::message_entry::of(fg::tensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  CHECK(e.descriptor == fusewire::tensor_descriptor::make(fusewire::dtype::float32, {2, 3}));
  CHECK(e.bytes.size() == 24u);
  CHECK(e.bytes.owns_memory());
  CHECK_FALSE(e.dead);
  fg::tensor back;
  CHECK_FALSE(e.to_tensor(back));
  CHECK(back == fg::tensor({2, 3}, {1, 2, 3, 4, 5, 6}));

  auto token = fg::message_entry::token(true);
  CHECK(token.dead);
  CHECK(token.bytes.empty());
  CHECK(token.descriptor == fg::token_descriptor());

  // A transport hands over what it received; the executor checks it.
  fg::message_entry wrong{fusewire::tensor_descriptor::make(fusewire::dtype::int32, {2}),
                          fusewire::tensor_buffer::allocate(8), false};
  CHECK(wrong.to_tensor(back) == errc::invalid_argument);
  fg::message_entry short_entry{fusewire::tensor_descriptor::make(fusewire::dtype::float32, {4}), e.bytes.share(0, 12),
                                false};
  CHECK(short_entry.to_tensor(back) == errc::size_mismatch);
  CHECK(back == fg::tensor({2, 3}, {1, 2, 3, 4, 5, 6}));  // untouched on failure
  CHECK(e.bytes.use_count() == 2u);                       // share() aliased, did not copy
}

TEST_CASE("counters count messages, entries and live bytes per step") {
  fg::local_channel ch;
  fg::payload p;
  p.push_back(fg::message_entry::of(fg::tensor({4}, {1, 2, 3, 4})));
  p.push_back(fg::message_entry::token(true));
  p.push_back(fg::message_entry::of(fg::tensor({2}, {1, 2})));
  CHECK_FALSE(ch.send(7, "a", std::move(p)));
  CHECK_FALSE(ch.send(7, "b", one(1)));
  auto c = ch.sent(7);
  CHECK(c.messages == 2);
  CHECK(c.tensors == 4);
  CHECK(c.bytes == 28);
  CHECK(ch.sent(8).messages == 0);
  ch.forget(7);
  CHECK(ch.sent(7).messages == 0);
}

}  // namespace channel_cases
