#pragma once
/// The parameter-server layer: model spec and placement, the request
/// encoding, optimizers, the PS state (shard), ps::server and ps::client with
/// their config aggregates, and ps::serve_until_signal.

#include <fusewire/ps/batch.hpp>
#include <fusewire/ps/client.hpp>
#include <fusewire/ps/config.hpp>
#include <fusewire/ps/message.hpp>
#include <fusewire/ps/model.hpp>
#include <fusewire/ps/optimizer.hpp>
#include <fusewire/ps/serve.hpp>
#include <fusewire/ps/server.hpp>
#include <fusewire/ps/shard.hpp>
