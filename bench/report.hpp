#pragma once
/// fwbench's outputs: the table at the end, JSON, CSV, and the gnuplot figure
/// (latency, bandwidth and throughput per payload scheme, one bar per backend).

#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "results.hpp"

namespace fusewire::bench {

/// One row per cell: headline numbers (medians over repetitions, with the
/// headline's min..max when there were several), CPU and memory.
void print_table(std::FILE* out, const std::vector<cell>& cells);

/// Writes `{"fwbench":..., "host":..., "results":[cells...]}` merged with
/// `extra`. Throws `system_error` naming the file when it cannot be written.
void write_json(const std::string& path, const std::vector<cell>& cells, const nlohmann::json& extra);

/// One CSV row per repetition (and one per skipped cell).
void write_csv(const std::string& path, const std::vector<cell>& cells);

/// The gnuplot script that draws `cells` into `path` (.svg or .png).
std::string plot_script(const std::string& path, const std::vector<cell>& cells, const std::string& title);

/// Runs gnuplot on `plot_script`. Throws `system_error` when the extension is
/// neither .svg nor .png, or gnuplot is missing or fails (the script is then
/// left next to the figure as PATH.gp).
void write_plot(const std::string& path, const std::vector<cell>& cells, const std::string& title);

/// "host: N CPUs, kernel" for titles and JSON.
nlohmann::json host_info();

}  // namespace fusewire::bench
