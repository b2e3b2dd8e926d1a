// Loading plugins of models and datasets. The ABI record is plain data read before any plugin code runs, so a
// plugin built against another dprun is refused with a message instead of crashing inside it.
#include "models/plugin_loader.hpp"

#include <dlfcn.h>

#include <algorithm>
#include <boost/dll/import.hpp>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <mutex>
#include <set>
#include <sstream>

#include "dpstore/store.hpp"

namespace dprun {

namespace fs = std::filesystem;

namespace {

// Every library ever loaded, never unloaded: models, layers and std::functions a plugin creates
// point into its code. Allocated once and never destroyed, so no static destructor can unload a
// plugin while another static still holds one of its objects.
struct Registry {
  std::mutex mutex;
  std::vector<boost::dll::shared_library> libraries;
};

Registry& registry() {
  static Registry* r = new Registry;
  return *r;
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "0x%08X", v);
  return buf;
}

// An absolute, normalised spelling of `p` (symlinks resolved where the file exists), so the
// same plugin reached twice through the search path is recognised.
std::string absolute_path(const fs::path& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(p, ec);
  if (ec) c = fs::absolute(p, ec).lexically_normal();
  return c.string();
}

bool is_plugin_name(const fs::path& p) {
  const std::string name = p.filename().string();
  return name.rfind("lib", 0) == 0 && p.extension() == ".so" &&
         name.find("dprun") != std::string::npos;
}

// A shared library by its name: NAME.so or NAME.so.VERSION.
bool is_shared_library_name(const fs::path& p) {
  const std::string name = p.filename().string();
  return p.extension() == ".so" || name.find(".so.") != std::string::npos;
}

}  // namespace

std::vector<std::string> plugin_search_path(const std::vector<std::string>& extra) {
  std::vector<std::string> candidates(extra.begin(), extra.end());
  if (const char* env = std::getenv("DPRUN_PLUGIN_PATH"); env && *env) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':')) {
      if (!item.empty()) candidates.push_back(item);
    }
  }
  std::error_code ec;
  const fs::path exe = boost::dll::program_location(ec);
  if (!ec) candidates.push_back((exe.parent_path() / ".." / "lib" / "dprun" / "plugins").string());
  candidates.push_back(DPRUN_BUILD_PLUGIN_DIR);

  std::vector<std::string> out;
  std::set<std::string> seen;
  for (const auto& c : candidates) {
    std::error_code exists_ec;
    if (!fs::exists(c, exists_ec)) continue;
    const std::string a = absolute_path(c);
    if (seen.insert(a).second) out.push_back(a);
  }
  return out;
}

namespace {

// Loads the library (kept loaded until the process ends, whatever follows).
boost::dll::shared_library open_library(const std::string& path) {
  // rtld_now: a plugin with an unresolved symbol fails here, with the linker's message, rather
  // than in the middle of a training step.
  boost::dll::shared_library lib;
  boost::dll::fs::error_code ec;
  lib.load(path, ec, boost::dll::load_mode::rtld_now);
  if (ec || !lib.is_loaded()) {
    const char* why = dlerror();
    throw PluginError(path + ": cannot be loaded as a shared library: " +
                      (why ? std::string(why) : ec.message()));
  }
  // Kept even when the checks that follow refuse it: its static initialisers have run, and what
  // they registered must not point into unmapped code.
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  r.libraries.push_back(lib);
  return lib;
}

// The plugin's ABI record, checked before any function of it is called.
const dp::PluginAbi& checked_abi(const boost::dll::shared_library& lib, const std::string& path) {
  if (!lib.has("dprun_plugin_abi")) {
    throw PluginError(path +
                      ": not a dprun plugin: it does not export dprun_plugin_abi (build it with "
                      "DPRUN_PLUGIN(function) from dp/plugin.hpp, like plugins/lenet)");
  }
  const dp::PluginAbi& abi = lib.get<const dp::PluginAbi>("dprun_plugin_abi");
  if (abi.magic != DPRUN_PLUGIN_MAGIC) {
    throw PluginError(path + ": dprun_plugin_abi has magic " + hex32(abi.magic) + ", expected " +
                      hex32(DPRUN_PLUGIN_MAGIC) +
                      " (\"DPRN\"): not a dprun plugin, or a damaged build");
  }
  if (abi.abi_version != DPRUN_PLUGIN_ABI_VERSION) {
    // Fields after abi_version may differ between versions: none is read here.
    throw PluginError(path + ": plugin ABI version " + std::to_string(abi.abi_version) +
                      ", this dprun expects " + std::to_string(DPRUN_PLUGIN_ABI_VERSION) +
                      ": rebuild the plugin against this dprun");
  }
  if (!lib.has("dprun_plugin_models") && !lib.has("dprun_plugin_datasets")) {
    throw PluginError(path +
                      ": exports dprun_plugin_abi but not dprun_plugin_models nor "
                      "dprun_plugin_datasets (export the lists with DPRUN_PLUGIN(models), "
                      "DPRUN_DATASET_PLUGIN(datasets) or DPRUN_PLUGIN_MODELS_AND_DATASETS from "
                      "dp/plugin.hpp)");
  }
  return abi;
}

// Calls one of the plugin's list functions, turning its exceptions into "the plugin failed".
template <typename Fn>
auto call_plugin(Fn& fn, const std::string& path, const char* what) {
  try {
    return fn();
  } catch (const std::exception& e) {
    throw PluginError(path + ": " + what + "() threw: " + e.what());
  } catch (...) {
    throw PluginError(path + ": " + what + "() threw an exception that is not a std::exception");
  }
}

// The datasets the plugin's function returns, each with a name and a load function, no name
// twice.
std::vector<LoadedDataset> datasets_of(boost::dll::shared_library& lib, const dp::PluginAbi& abi,
                                       const std::string& path) {
  if (!lib.has("dprun_plugin_datasets")) return {};
  // Imported outside call_plugin's try block: only the plugin's own exceptions are its failure.
  auto& datasets_fn = lib.get_alias<dp::PluginDatasetsFn>("dprun_plugin_datasets");
  std::vector<dp::DatasetFactory> factories =
      call_plugin(datasets_fn, path, "dprun_plugin_datasets");
  if (factories.empty())
    throw PluginError(path + ": dprun_plugin_datasets() returned no datasets");
  std::vector<LoadedDataset> out;
  std::set<std::string> names;
  for (size_t i = 0; i < factories.size(); ++i) {
    auto& f = factories[i];
    const std::string which = "dataset #" + std::to_string(i + 1) +
                              (f.name.empty() ? std::string() : " \"" + f.name + "\"");
    if (f.name.empty()) throw PluginError(path + ": " + which + " has an empty name");
    if (!f.load) throw PluginError(path + ": " + which + " has no load function");
    if (!names.insert(f.name).second)
      throw PluginError(path + ": " + which + ": the plugin declares this name twice");
    out.push_back({std::move(f), path, abi.abi_version,
                   abi.built_with_dprun ? abi.built_with_dprun : ""});
  }
  return out;
}

// The models the plugin's function returns, each with a name and a build function, no name
// twice.
std::vector<LoadedModel> models_of(boost::dll::shared_library& lib, const dp::PluginAbi& abi,
                                   const std::string& path) {
  if (!lib.has("dprun_plugin_models")) return {};  // a plugin of datasets only
  // Imported outside call_plugin's try block: only exceptions from the plugin's own code are
  // turned into "the plugin failed".
  auto& models_fn = lib.get_alias<dp::PluginModelsFn>("dprun_plugin_models");
  std::vector<dp::ModelFactory> factories = call_plugin(models_fn, path, "dprun_plugin_models");
  if (factories.empty()) throw PluginError(path + ": dprun_plugin_models() returned no models");
  const std::string built_with = abi.built_with_dprun ? abi.built_with_dprun : "";
  std::vector<LoadedModel> out;
  std::set<std::string> names;
  for (size_t i = 0; i < factories.size(); ++i) {
    auto& f = factories[i];
    const std::string which = "model #" + std::to_string(i + 1) +
                              (f.name.empty() ? std::string() : " \"" + f.name + "\"");
    if (f.name.empty()) throw PluginError(path + ": " + which + " has an empty name");
    if (!f.build) throw PluginError(path + ": " + which + " has no build function");
    if (!names.insert(f.name).second) {
      throw PluginError(path + ": " + which + ": the plugin declares this name twice");
    }
    LoadedModel m;
    m.factory = std::move(f);
    m.plugin_path = path;
    m.abi_version = abi.abi_version;
    m.built_with = built_with;
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace

LoadedPlugin load_plugin_file(const std::string& file) {
  std::error_code fs_ec;
  if (!fs::exists(file, fs_ec)) throw PluginError(file + ": no such plugin file");
  if (fs::is_directory(file, fs_ec)) {
    throw PluginError(file + ": is a folder, expected a plugin shared library (lib*.so)");
  }
  const std::string path = absolute_path(file);
  boost::dll::shared_library lib = open_library(path);
  const dp::PluginAbi& abi = checked_abi(lib, path);
  LoadedPlugin out;
  out.models = models_of(lib, abi, path);
  out.datasets = datasets_of(lib, abi, path);
  return out;
}

std::vector<LoadedModel> load_plugin(const std::string& file) {
  return load_plugin_file(file).models;
}

std::map<std::string, LoadedDataset> builtin_dataset_map() {
  std::map<std::string, LoadedDataset> out;
  for (const dp::DatasetFactory& f : dp::builtin_datasets())
    out.emplace(f.name, LoadedDataset{f, "", DPRUN_PLUGIN_ABI_VERSION, ""});
  return out;
}

PluginScan scan_plugins(const std::vector<std::string>& extra) {
  PluginScan scan;
  for (const auto& e : extra) {
    std::error_code ec;
    if (!fs::exists(e, ec)) scan.errors.push_back(e + ": no such plugin file or folder");
  }
  scan.searched = plugin_search_path(extra);

  std::set<std::string> loaded;  // one load per file, however often it is reached
  auto load_into = [&](const std::string& file) {
    const std::string a = absolute_path(file);
    if (!loaded.insert(a).second) return;
    try {
      LoadedPlugin plugin = load_plugin_file(a);
      for (auto& m : plugin.models) {
        const std::string name = m.factory.name;
        scan.models.emplace(name, std::move(m));  // the first one found wins
      }
      for (auto& d : plugin.datasets) {
        const std::string name = d.factory.name;
        if (dp::find_builtin_dataset(name) != nullptr)
          scan.errors.push_back(a + ": dataset \"" + name +
                                "\": dprun has a built-in dataset of this name, which a plugin "
                                "cannot replace; rename the plugin's dataset");
        else
          scan.datasets.emplace(name, std::move(d));  // the first one found wins
      }
    } catch (const PluginError& err) {
      scan.errors.push_back(err.what());
    }
  };

  for (const auto& entry : scan.searched) {
    std::error_code ec;
    if (!fs::is_directory(entry, ec)) {
      load_into(entry);  // a file given explicitly: loaded whatever its name
      continue;
    }
    std::vector<fs::path> files;
    for (const auto& de : fs::directory_iterator(entry, ec)) {
      std::error_code type_ec;
      if (!de.is_regular_file(type_ec)) continue;
      if (is_plugin_name(de.path())) {
        files.push_back(de.path());
      } else if (is_shared_library_name(de.path())) {
        // Not loaded (a folder may hold other libraries, whose initialisers should not run),
        // but said: a user whose plugin is named differently must not be left guessing.
        scan.skipped.push_back(
            absolute_path(de.path()) +
            ": not loaded: a plugin's file name is lib*dprun*.so (dprun_add_plugin names it "
            "libdprun_NAME.so); rename it, or give the file itself with --plugins FILE");
      }
    }
    std::sort(scan.skipped.begin(), scan.skipped.end());
    if (ec) scan.errors.push_back(entry + ": cannot list the folder: " + ec.message());
    std::sort(files.begin(), files.end());  // a stable order: the same model wins every run
    for (const auto& f : files) load_into(f.string());
  }
  return scan;
}

std::string file_sha256(const std::string& file) {
  std::ifstream in(file, std::ios::binary);
  if (!in) throw PluginError(file + ": cannot open to compute its sha256: " + std::strerror(errno));
  std::ostringstream bytes;
  bytes << in.rdbuf();
  if (in.bad()) throw PluginError(file + ": read error while computing its sha256");
  return dps::sha256_hex(bytes.str());
}

}  // namespace dprun
