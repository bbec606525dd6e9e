// The transport concepts checked against minimal archetypes: the archetype
// satisfies each concept; a copy missing any one member does not.
#include <fusewire/transport/concepts.hpp>

#include <doctest/doctest.h>

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <system_error>

namespace fw = fusewire;

namespace fusewire::test::archetype {

struct reactor {};

// Each member can be switched off to build a type that lacks exactly that piece.
enum piece : unsigned {
  c_none = 0,
  c_tag = 1u << 0,
  c_write = 1u << 1,
  c_read = 1u << 2,
  c_read_some = 1u << 3,
  c_close = 1u << 4,
  c_endpoint = 1u << 5,
  c_release = 1u << 6,
  c_try_read = 1u << 7,
};

template <unsigned Missing>
struct connection_base {};
template <unsigned Missing>
  requires((Missing & c_tag) == 0)
struct connection_base<Missing> {
  using connection_concept = fw::connection_tag;
};

template <unsigned Missing = c_none>
struct connection : connection_base<Missing> {
  template <fw::io_handler H>
    requires((Missing & c_write) == 0)
  void async_write(std::span<const fw::const_buffer>, H&&) {}
  template <fw::io_handler H>
    requires((Missing & c_read) == 0)
  void async_read(fw::mutable_buffer, H&&) {}
  template <fw::read_some_handler H>
    requires((Missing & c_read_some) == 0)
  void async_read_some(H&&) {}
  void close()
    requires((Missing & c_close) == 0)
  {}
  bool is_open() const { return false; }
  std::string remote_endpoint() const
    requires((Missing & c_endpoint) == 0)
  {
    return {};
  }
  template <fw::release_handler H>
    requires((Missing & c_release) == 0)
  void async_release(H&&) {}
  bool try_read(fw::mutable_buffer)
    requires((Missing & c_try_read) == 0)
  {
    return false;
  }
};

enum listener_piece : unsigned { l_none = 0, l_tag = 1, l_accept = 2, l_port = 4, l_close = 8 };

template <unsigned Missing>
struct listener_base {};
template <unsigned Missing>
  requires((Missing & l_tag) == 0)
struct listener_base<Missing> {
  using listener_concept = fw::listener_tag;
};

template <unsigned Missing = l_none, class Connection = connection<>>
struct listener : listener_base<Missing> {
  using connection_type = Connection;
  template <fw::connection_handler<Connection> H>
    requires((Missing & l_accept) == 0)
  void async_accept(H&&) {}
  std::uint16_t port() const
    requires((Missing & l_port) == 0)
  {
    return 0;
  }
  void close()
    requires((Missing & l_close) == 0)
  {}
};

enum transport_piece : unsigned {
  t_none = 0,
  t_tag = 1,
  t_connect = 2,
  t_listen = 4,
  t_name = 8,
  t_listen_ec = 16,
  t_adopt = 32,
};

template <unsigned Missing>
struct transport_base {};
template <unsigned Missing>
  requires((Missing & t_tag) == 0)
struct transport_base<Missing> {
  using transport_concept = fw::transport_tag;
};

template <unsigned Missing = t_none, class Connection = connection<>>
struct transport : transport_base<Missing> {
  using reactor_type = reactor;
  using connection_type = Connection;
  using listener_type = listener<l_none, Connection>;
  template <fw::connection_handler<Connection> H>
    requires((Missing & t_connect) == 0)
  void connect(reactor&, std::string_view, std::uint16_t, H&&) {}
  listener_type listen(reactor&, std::string_view, std::uint16_t)
    requires((Missing & t_listen) == 0)
  {
    return {};
  }
  listener_type listen(reactor&, std::string_view, std::uint16_t, std::error_code&)
    requires((Missing & t_listen_ec) == 0)
  {
    return {};
  }
  Connection adopt(reactor&, int, std::error_code&)
    requires((Missing & t_adopt) == 0)
  {
    return {};
  }
  static constexpr std::string_view name()
    requires((Missing & t_name) == 0)
  {
    return "archetype";
  }
};

/// A transport whose listener hands out a different connection type than it names.
struct mismatched_transport : transport<> {
  struct other_connection : connection<> {};
  using connection_type = other_connection;
};

/// A connection whose handler parameter is not move-only friendly: takes the handler by copy.
struct copying_connection : connection<> {
  template <class H>
    requires std::copy_constructible<H>
  void async_read_some(H) {}
};

}  // namespace fusewire::test::archetype

namespace archetype = fusewire::test::archetype;

// The archetypes model the concepts...
static_assert(fw::connection<archetype::connection<>>);
static_assert(fw::listener<archetype::listener<>>);
static_assert(fw::transport<archetype::transport<>>);

// ...and removing any single piece breaks them, through the named sub-concept.
static_assert(!fw::connection<archetype::connection<archetype::c_tag>>);
static_assert(!fw::detail::connection_opts_in<archetype::connection<archetype::c_tag>>);
static_assert(!fw::connection<archetype::connection<archetype::c_write>>);
static_assert(!fw::detail::connection_writes_scatter_gather<archetype::connection<archetype::c_write>>);
static_assert(!fw::connection<archetype::connection<archetype::c_read>>);
static_assert(!fw::detail::connection_reads_exact<archetype::connection<archetype::c_read>>);
static_assert(!fw::connection<archetype::connection<archetype::c_read_some>>);
static_assert(!fw::detail::connection_reads_some<archetype::connection<archetype::c_read_some>>);
static_assert(!fw::connection<archetype::connection<archetype::c_close>>);
static_assert(!fw::detail::connection_closes<archetype::connection<archetype::c_close>>);
static_assert(!fw::connection<archetype::connection<archetype::c_endpoint>>);
static_assert(!fw::detail::connection_names_peer<archetype::connection<archetype::c_endpoint>>);
static_assert(!fw::connection<archetype::copying_connection>);  // must accept move-only handlers

static_assert(!fw::listener<archetype::listener<archetype::l_tag>>);
static_assert(!fw::listener<archetype::listener<archetype::l_accept>>);
static_assert(!fw::detail::listener_accepts<archetype::listener<archetype::l_accept>>);
static_assert(!fw::listener<archetype::listener<archetype::l_port>>);
static_assert(!fw::detail::listener_has_port<archetype::listener<archetype::l_port>>);
static_assert(!fw::listener<archetype::listener<archetype::l_close>>);

static_assert(!fw::transport<archetype::transport<archetype::t_tag>>);
static_assert(!fw::transport<archetype::transport<archetype::t_connect>>);
static_assert(!fw::detail::transport_connects<archetype::transport<archetype::t_connect>>);
static_assert(!fw::transport<archetype::transport<archetype::t_listen>>);
static_assert(!fw::transport<archetype::transport<archetype::t_listen_ec>>);
static_assert(!fw::detail::transport_listens<archetype::transport<archetype::t_listen_ec>>);
static_assert(!fw::transport<archetype::transport<archetype::t_name>>);
static_assert(!fw::transport<archetype::mismatched_transport>);

// The hand-off: a transport that cannot adopt, or whose connections cannot be
// released, is still a transport, but not a handoff_transport.
static_assert(fw::handoff_transport<archetype::transport<>>);
using unreleasing_transport = archetype::transport<archetype::t_none, archetype::connection<archetype::c_release>>;
static_assert(fw::transport<unreleasing_transport>);
static_assert(!fw::handoff_transport<unreleasing_transport>);
static_assert(!fw::detail::connection_releases<archetype::connection<archetype::c_release>>);
static_assert(fw::transport<archetype::transport<archetype::t_adopt>>);
static_assert(!fw::handoff_transport<archetype::transport<archetype::t_adopt>>);
static_assert(!fw::detail::transport_adopts<archetype::transport<archetype::t_adopt>>);

// Serving reads from what arrived: optional; without try_read a connection
// is still a connection.
static_assert(fw::readahead_connection<archetype::connection<>>);
static_assert(fw::connection<archetype::connection<archetype::c_try_read>>);
static_assert(!fw::readahead_connection<archetype::connection<archetype::c_try_read>>);
static_assert(!fw::detail::connection_takes_read_ahead<archetype::connection<archetype::c_try_read>>);

// Handler concepts take exactly the documented signatures.
static_assert(fw::io_handler<fw::detail::io_handler_archetype>);
static_assert(!fw::io_handler<fw::detail::read_some_handler_archetype>);
static_assert(fw::read_some_handler<fw::detail::read_some_handler_archetype>);
static_assert(!fw::read_some_handler<fw::detail::io_handler_archetype>);
static_assert(fw::connection_handler<fw::detail::connection_handler_archetype<int>, int>);
static_assert(fw::release_handler<fw::detail::release_handler_archetype>);
static_assert(!fw::release_handler<fw::detail::read_some_handler_archetype>);

TEST_CASE("transport concepts are checked by archetypes at compile time") {
  CHECK(fw::connection<archetype::connection<>>);
  CHECK_FALSE(fw::connection<archetype::connection<archetype::c_read_some>>);
  CHECK(fw::handoff_transport<archetype::transport<>>);
  CHECK_FALSE(fw::handoff_transport<archetype::transport<archetype::t_adopt>>);
}
