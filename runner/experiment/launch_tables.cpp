// The launch tables of an experiment file (experiment/launch_tables.hpp): what may be written.
#include "experiment/launch_tables.hpp"

namespace dprun {

const std::vector<std::string>& known_launchers() {
  static const std::vector<std::string> launchers = {"mpirun", "srun"};
  return launchers;
}

std::string sbatch_args_problem(const std::vector<std::string>& args) {
  struct Reserved {
    const char* long_name;  // without "--"
    const char* short_name;
    const char* instead;
  };
  static const Reserved reserved[] = {
      {"array", "-a", "dprun makes the array (one task per trial); cap it with --max-parallel"},
      {"output", "-o", "dprun names each task's output after its database (tNNNN.out)"},
      {"ntasks", "-n", "dprun asks for one task per process of the trial (its processes setting)"},
      {"parsable", nullptr, "dprun reads sbatch's answer itself"},
      {"wrap", nullptr, "dprun writes the job script itself"},
      {"clusters", "-M",
       "dprun asks squeue and scontrol about the job on the default cluster, where a job id "
       "sbatch gives for another cluster is unknown; submit from a host of that cluster"},
      {"error", "-e",
       "slurmstepd writes why Slurm stopped a task (the CANCELLED lines dprun reads) to the "
       "task's stderr, which must stay in its tNNNN.out"},
      {"chdir", "-D",
       "the job script and the task databases are named by paths relative to the folder "
       "dprun submit is run from; run it from the folder you want instead"}};
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    for (const auto& r : reserved) {
      bool hit = r.short_name && a.rfind(r.short_name, 0) == 0;
      if (a.rfind("--", 0) == 0) {
        // sbatch takes any unambiguous abbreviation of a long option: "--arr=", "--pars".
        const std::string name =
            a.substr(2, a.find('=') == std::string::npos ? std::string::npos : a.find('=') - 2);
        hit = name.size() >= 3 && std::string(r.long_name).rfind(name, 0) == 0;
      }
      if (hit) return "sbatch option " + a + " cannot be given to dprun submit: " + r.instead;
    }
    if (a.empty() || a[0] != '-') {
      const std::string& before = i > 0 ? args[i - 1] : std::string();
      // The value of the short option before it ("-p debug")?
      if (before.size() == 2 && before[0] == '-' && before[1] != '-') continue;
      if (before.rfind("--", 0) == 0 && before.find('=') == std::string::npos)
        return "sbatch argument '" + a + "' follows " + before + ": write " + before + "=" + a +
               " (a bare word may be taken as sbatch's script; dprun writes the job script "
               "itself)";
      return "sbatch argument '" + a +
             "' is not an option (sbatch would take it as its script; dprun writes the job "
             "script itself)";
    }
  }
  return "";
}

}  // namespace dprun
