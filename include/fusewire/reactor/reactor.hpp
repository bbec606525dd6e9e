#pragma once
/// The share-nothing reactor: one event loop per core that owns its I/O
/// engine, its connections and its timers; and the group that runs N of them
/// and carries work between them through bounded lock-free SPSC inboxes.
///
/// Threading contract:
/// - Everything on a `basic_reactor` (post, timers, its engine, the connections
///   made on it) is used only on that reactor's own thread, except where a
///   member says otherwise.
/// - Other threads reach a reactor only through `basic_reactor_group::submit_to`
///   (or an attached `sender`). Each (sender thread, reactor) pair has its own
///   SPSC queue (capacity `reactor_config::inbox_capacity`), drained `batch`
///   items at a time. Threads that neither run a reactor nor attached a sender
///   use a mutex-protected fallback queue.
/// - A reactor sleeps only in `adaptive` (after `idle_poll` without work) and
///   `block` modes; a sender writes the reactor's eventfd only when the reactor
///   is asleep (a seq_cst fence on both sides orders "queue an item" against
///   "announce sleep", so a wake-up is never lost).
///
/// Exceptions never cross the loop: one escaping a task, timer or handler is
/// caught, counted (`stats().exceptions`) and passed to `reactor_config::on_error`.

#include <fusewire/reactor/basic_reactor.hpp>
#include <fusewire/reactor/engine.hpp>
#include <fusewire/reactor/reactor_config.hpp>
#include <fusewire/reactor/reactor_group.hpp>
