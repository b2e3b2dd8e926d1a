// Slurm without a cluster: [launch.slurm] in experiment files (every mistake at file:line), the
// sbatch command and job script dprun submit builds, and reading what squeue, scontrol and
// slurmstepd say. The real cluster is test_slurm_cluster.cpp.
#include <algorithm>
#include <catch2/catch.hpp>

#include "experiment_helpers.hpp"
#include "process/launch.hpp"
#include "slurm/slurm.hpp"
#include "slurm/submission.hpp"

using Catch::Matchers::Contains;
using dprun::SlurmConfig;
using dprun::TaskShape;
using exptest::error_of;
using exptest::errors_of;
using exptest::kHead;
using exptest::parse;
using Words = std::vector<std::string>;

namespace {

const std::string kTrain = "[train]\nmodel = \"lenet\"\n";  // lines 3-4

std::string message_of(const std::string& text) { return error_of(text).what(); }

}  // namespace

TEST_CASE("slurm: [launch.slurm] and [launch] slurm = {...} are read", "[slurm]") {
  auto ex = parse(kHead + kTrain +
                  "[launch.slurm]\npartition = \"gpu\"\ntime = \"1-02:00:00\"\naccount = \"ml\"\n"
                  "qos = \"high\"\nmem = \"16G\"\ncpus_per_task = 4\nmax_parallel = 8\n"
                  "args = [\"--constraint=a100\", \"--exclusive\"]\n");
  CHECK(ex.slurm.given);
  CHECK(ex.slurm.partition == "gpu");
  CHECK(ex.slurm.time == "1-02:00:00");
  CHECK(ex.slurm.account == "ml");
  CHECK(ex.slurm.qos == "high");
  CHECK(ex.slurm.mem == "16G");
  CHECK(ex.slurm.cpus_per_task == 4);
  CHECK(ex.slurm.max_parallel == 8);
  CHECK(ex.slurm.args == Words{"--constraint=a100", "--exclusive"});

  auto inline_table =
      parse(kHead + kTrain + "[launch]\nslurm = { partition = \"debug\", max_parallel = 2 }\n");
  CHECK(inline_table.slurm.given);
  CHECK(inline_table.slurm.partition == "debug");
  CHECK(inline_table.slurm.max_parallel == 2);

  CHECK_FALSE(parse(kHead + kTrain).slurm.given);
  // How a sweep is submitted is not part of any trial's identity.
  CHECK(inline_table.trials[0].config_hash == parse(kHead + kTrain).trials[0].config_hash);
}

TEST_CASE("slurm: every mistake in [launch.slurm] names file:line and the key", "[slurm]") {
  const std::string head = kHead + kTrain + "[launch.slurm]\n";  // the keys start at line 6
  CHECK_THAT(message_of(head + "partion = \"gpu\"\n"),
             Contains("t.toml:6:1: launch.slurm.partion: unknown key; did you mean "
                      "\"partition\"?") &&
                 Contains("other sbatch options go in args"));
  CHECK_THAT(message_of(head + "max_parallel = 0\n"),
             Contains("t.toml:6:16: launch.slurm.max_parallel: expected a positive integer") &&
                 Contains("got 0"));
  CHECK_THAT(message_of(head + "cpus_per_task = \"4\"\n"),
             Contains("t.toml:6:17: launch.slurm.cpus_per_task: expected a positive integer"));
  CHECK_THAT(message_of(head + "time = \"two hours\"\n"),
             Contains("t.toml:6:8: launch.slurm.time: expected a Slurm time limit") &&
                 Contains("got \"two hours\""));
  CHECK_THAT(message_of(head + "mem = \"lots\"\n"),
             Contains("t.toml:6:7: launch.slurm.mem: expected memory per node"));
  CHECK_THAT(message_of(head + "partition = \"\"\n"),
             Contains("t.toml:6:13: launch.slurm.partition: expected a non-empty string"));
  CHECK_THAT(message_of(head + "args = \"--exclusive\"\n"),
             Contains("t.toml:6:8: launch.slurm.args: expected a list of strings"));
  CHECK_THAT(message_of(head + "args = [\"--array=0-9\"]\n"),
             Contains("t.toml:6:8: launch.slurm.args: sbatch option --array=0-9 cannot be given") &&
                 Contains("--max-parallel"));
  CHECK_THAT(message_of(kHead + kTrain + "[launch]\nslurm = \"gpu\"\n"),
             Contains("t.toml:6:9: launch.slurm: expected a table of sbatch settings"));
  // Every problem at once, not only the first.
  CHECK(errors_of(head + "max_parallel = -1\ntime = \"soon\"\nnope = 1\n").size() == 3);
  // Slurm's time forms are all accepted.
  for (const char* t : {"30", "30:00", "2:00:00", "1-0", "1-2:00", "1-02:00:00", "UNLIMITED"})
    CHECK(parse(head + "time = \"" + t + "\"\n").slurm.time == t);
}

TEST_CASE("slurm: one array task per trial, shaped by its gpus and processes", "[slurm]") {
  SlurmConfig config;
  // CPU backend: each replica is a thread, so a core each.
  const TaskShape cpu = dprun::task_shape(config, 2, 1, true);
  CHECK(cpu.processes == 1);
  CHECK(cpu.gpus_per_process == 0);
  CHECK(cpu.cpus_per_process == 2);
  CHECK(cpu.text() == "1 process, 2 CPUs");
  // CUDA: GPUs per process; srun starts the processes inside the allocation.
  const TaskShape gpu = dprun::task_shape(config, 16, 2, false);
  CHECK(gpu.processes == 2);
  CHECK(gpu.gpus_per_process == 8);
  CHECK(gpu.cpus_per_process == 0);
  CHECK(gpu.text() == "2 processes x 8 GPUs");

  CHECK(dprun::sbatch_command(config, cpu, 3, "dprun-sw", "/r/sw.tasks/s0001", {},
                              "/r/sw.tasks/s0001/job.sh") ==
        Words{"sbatch", "--parsable", "--job-name=dprun-sw", "--array=0-2",
              "--output=/r/sw.tasks/s0001/t%4a.out", "--ntasks=1", "--cpus-per-task=2",
              "/r/sw.tasks/s0001/job.sh"});

  config.max_parallel = 4;
  config.partition = "gpu";
  config.time = "2:00:00";
  config.mem = "32G";
  config.cpus_per_task = 6;
  config.args = {"--constraint=a100"};
  const TaskShape gpu6 = dprun::task_shape(config, 16, 2, false);
  CHECK(gpu6.cpus_per_process == 6);
  CHECK(dprun::sbatch_command(config, gpu6, 10, "dprun-scaling", "F", {"--qos=low"}, "F/job.sh") ==
        Words{"sbatch", "--parsable", "--job-name=dprun-scaling", "--array=0-9%4",
              "--output=F/t%4a.out", "--ntasks=2", "--gpus-per-task=8", "--cpus-per-task=6",
              "--partition=gpu", "--time=2:00:00", "--mem=32G", "--constraint=a100", "--qos=low",
              "F/job.sh"});
}

TEST_CASE("slurm: GPUs as a generic resource, one process per node", "[slurm]") {
  auto ex = parse(kHead + kTrain + "[launch.slurm]\ngpus_as = \"gres\"\n");
  CHECK(ex.slurm.gres);
  CHECK_FALSE(parse(kHead + kTrain + "[launch.slurm]\ngpus_as = \"gpus-per-task\"\n").slurm.gres);
  CHECK_THAT(message_of(kHead + kTrain + "[launch.slurm]\ngpus_as = \"gpu\"\n"),
             Contains("t.toml:6:11: launch.slurm.gpus_as: expected \"gpus-per-task\"") &&
                 Contains("got \"gpu\""));
  const SlurmConfig& config = ex.slurm;
  CHECK(dprun::sbatch_command(config, dprun::task_shape(config, 4, 1, false), 2, "j", "F", {},
                              "F/job.sh") == Words{"sbatch", "--parsable", "--job-name=j",
                                                   "--array=0-1", "--output=F/t%4a.out",
                                                   "--ntasks=1", "--gres=gpu:4", "F/job.sh"});
  CHECK(dprun::sbatch_command(config, dprun::task_shape(config, 16, 2, false), 1, "j", "F", {},
                              "F/job.sh") ==
        Words{"sbatch", "--parsable", "--job-name=j", "--array=0-0", "--output=F/t%4a.out",
              "--ntasks=2", "--nodes=2", "--ntasks-per-node=1", "--gres=gpu:8", "F/job.sh"});
  // The CPU backend asks for no GPUs either way.
  CHECK(dprun::sbatch_command(config, dprun::task_shape(config, 2, 1, true), 1, "j", "F", {},
                              "F/job.sh")[6] == "--cpus-per-task=2");
}

TEST_CASE("slurm: sbatch arguments dprun sets itself are refused", "[slurm]") {
  CHECK(dprun::sbatch_args_problem({}).empty());
  CHECK(dprun::sbatch_args_problem({"-p", "debug", "--time=10", "--exclusive", "--qos=x",
                                    "--part=gpu", "--ntasks-per-node=1", "-t", "5"})
            .empty());
  // A long option's value after a space: sbatch may take the word as its script.
  CHECK_THAT(dprun::sbatch_args_problem({"--time", "10"}),
             Contains("'10' follows --time: write --time=10"));
  CHECK_THAT(dprun::sbatch_args_problem({"--exclusive", "job.sh"}),
             Contains("write --exclusive=job.sh"));
  // Abbreviations sbatch accepts.
  CHECK_THAT(dprun::sbatch_args_problem({"--arr=0-3"}), Contains("dprun makes the array"));
  CHECK_THAT(dprun::sbatch_args_problem({"--out=x.out"}), Contains("tNNNN.out"));
  CHECK_THAT(dprun::sbatch_args_problem({"--ntask=2"}), Contains("processes setting"));
  CHECK_THAT(dprun::sbatch_args_problem({"--pars"}), Contains("reads sbatch's answer"));
  // Options that would break what dprun reads back.
  CHECK_THAT(dprun::sbatch_args_problem({"-M", "other"}), Contains("default cluster"));
  CHECK_THAT(dprun::sbatch_args_problem({"--clusters=other"}), Contains("default cluster"));
  CHECK_THAT(dprun::sbatch_args_problem({"--cluster=other"}), Contains("default cluster"));
  CHECK_THAT(dprun::sbatch_args_problem({"-e", "x.err"}), Contains("CANCELLED lines"));
  CHECK_THAT(dprun::sbatch_args_problem({"--error=x.err"}), Contains("tNNNN.out"));
  CHECK_THAT(dprun::sbatch_args_problem({"-D", "/scratch"}), Contains("relative to the folder"));
  CHECK_THAT(dprun::sbatch_args_problem({"--chdir=/scratch"}), Contains("relative to the folder"));
  CHECK_THAT(dprun::sbatch_args_problem({"--array=0-3"}), Contains("--max-parallel"));
  CHECK_THAT(dprun::sbatch_args_problem({"-a", "1-3"}), Contains("dprun makes the array"));
  CHECK_THAT(dprun::sbatch_args_problem({"--output", "x.out"}), Contains("tNNNN.out"));
  CHECK_THAT(dprun::sbatch_args_problem({"-n4"}), Contains("processes setting"));
  CHECK_THAT(dprun::sbatch_args_problem({"--parsable"}), Contains("cannot be given"));
  CHECK_THAT(dprun::sbatch_args_problem({"job.sh"}),
             Contains("'job.sh' is not an option (sbatch would take it as its script"));
  CHECK_THAT(dprun::sbatch_args_problem({"--time=10", "extra"}), Contains("'extra'"));
}

TEST_CASE("slurm: a % in the submission folder is escaped, a backslash refused", "[slurm]") {
  dprun::SlurmConfig config;
  const auto shape = dprun::task_shape(config, 1, 1, true);
  const auto cmd = dprun::sbatch_command(config, shape, 1, "j", "/r/100%/s0001", {}, "job.sh");
  CHECK(std::find(cmd.begin(), cmd.end(), "--output=/r/100%%/s0001/t%4a.out") != cmd.end());
  CHECK_THROWS_WITH(dprun::sbatch_command(config, shape, 1, "j", "/r/a\\b/s0001", {}, "job.sh"),
                    Contains("has a backslash in its path") && Contains("in a folder whose path"));
}

TEST_CASE("slurm: the job script only starts the task", "[slurm]") {
  const std::string script =
      dprun::job_script("/opt/dprun bin/dprun", "/r/sw.tasks/s0002", "sw", 3);
  CHECK(script.rfind("#!/bin/sh\n", 0) == 0);
  CHECK_THAT(script, Contains("experiment sw, 3 trials"));
  // exec: Slurm's SIGTERM reaches dprun, which records why its trial stopped.
  CHECK_THAT(script, Contains("\nexec '/opt/dprun bin/dprun' __slurm-task /r/sw.tasks/s0002\n"));
  CHECK(dprun::task_stem(7) == "t0007");
  CHECK(dprun::task_stem(1234) == "t1234");
}

TEST_CASE("slurm: reading sbatch, squeue and scontrol", "[slurm]") {
  CHECK(dprun::parse_sbatch_job_id("12\n") == "12");
  CHECK(dprun::parse_sbatch_job_id("12;cluster1\n") == "12");
  CHECK(dprun::parse_sbatch_job_id("note: site policy applies\n4711\n") == "4711");
  CHECK(dprun::parse_sbatch_job_id("Submitted batch job 12\n").empty());
  CHECK(dprun::parse_sbatch_job_id("").empty());

  std::string problem;
  const auto live = dprun::parse_squeue("12|0|RUNNING\n12|3|PENDING\n\n13|1|COMPLETING\n", problem);
  REQUIRE(live);
  REQUIRE(live->size() == 2);
  CHECK(live->at("12").at(0) == "RUNNING");
  CHECK(live->at("12").at(3) == "PENDING");
  CHECK(live->at("13").at(1) == "COMPLETING");
  // A line it cannot read is no answer: a task skipped would look ended.
  CHECK_FALSE(dprun::parse_squeue("12|0|RUNNING\ngarbage\n", problem));
  CHECK_THAT(problem, Contains("squeue printed a line that is not JOB|INDEX|STATE: 'garbage'"));

  const auto ended = dprun::parse_scontrol_jobs(
      "JobId=14 ArrayJobId=12 ArrayTaskId=1 JobState=TIMEOUT Reason=TimeLimit ExitCode=0:15 "
      "BatchHost=node3\n"
      "JobId=12 ArrayJobId=12 ArrayTaskId=4-9%2 JobState=PENDING Reason=JobArrayTaskLimit\n"
      "JobId=15 ArrayJobId=12 ArrayTaskId=2 JobState=COMPLETED Reason=None ExitCode=0:0\n");
  REQUIRE(ended.size() == 2);  // the pending remainder "4-9%2" is not one task
  CHECK(ended.at(1).state == "TIMEOUT");
  CHECK(ended.at(1).node == "node3");
  CHECK(ended.at(2).exit_code == "0:0");
  CHECK(dprun::cause_from_state(ended.at(1)) ==
        "Slurm time limit reached (Slurm state TIMEOUT on node3)");
  CHECK(dprun::cause_from_state(ended.at(2)).empty());
  CHECK(dprun::ended_task_text(ended.at(2)) == "Slurm state COMPLETED, exit code 0:0");
  dprun::EndedTask killed;
  killed.state = "FAILED";
  killed.exit_code = "0:9";
  killed.node = "node2";
  CHECK(dprun::ended_task_text(killed) ==
        "the task was killed by SIGKILL (Slurm state FAILED, exit code 0:9 on node2)");
  dprun::EndedTask t;
  for (auto [state, words] : {std::pair{"CANCELLED", "cancelled by Slurm (scancel)"},
                              {"PREEMPTED", "preempted by Slurm"},
                              {"NODE_FAIL", "node failure (Slurm)"},
                              {"OUT_OF_MEMORY", "out of memory"}}) {
    t.state = state;
    CHECK_THAT(dprun::cause_from_state(t), Contains(words));
  }
}

TEST_CASE("slurm: why slurmstepd stopped a task, from its output", "[slurm]") {
  CHECK(dprun::cause_from_output("epoch 1\nepoch 2\n").empty());
  CHECK(dprun::cause_from_output(
            "[1/1] lenet epoch 1/2\nslurmstepd: error: *** JOB 13 ON node1 CANCELLED AT "
            "2026-01-01T10:00:00 ***\n") ==
        "cancelled by Slurm (scancel) (job 13 on node1 at 2026-01-01T10:00:00)");
  CHECK(dprun::cause_from_output("slurmstepd: error: *** JOB 13 ON node1 CANCELLED AT "
                                 "2026-01-01T10:00:00 DUE TO TIME LIMIT ***\n") ==
        "Slurm time limit reached (job 13 on node1 at 2026-01-01T10:00:00)");
  CHECK_THAT(dprun::cause_from_output("slurmstepd: error: *** JOB 7 ON n2 CANCELLED AT "
                                      "2026-01-01T10:00:00 DUE TO PREEMPTION ***\n"),
             Contains("preempted by Slurm"));
  CHECK_THAT(dprun::cause_from_output("slurmstepd: error: *** JOB 7 ON n2 CANCELLED AT "
                                      "2026-01-01T10:00:00 DUE TO NODE FAILURE ***\n"),
             Contains("node failure (Slurm)"));
  // scancel by another user names them.
  CHECK_THAT(dprun::cause_from_output("slurmstepd: error: *** JOB 7 ON n2 CANCELLED AT "
                                      "2026-01-01T10:00:00 DUE TO TIME LIMIT, uid 1000 ***\n"),
             Contains("Slurm time limit reached (job 7 on n2"));
}

TEST_CASE("slurm: a trial of several processes starts them with srun, found on PATH", "[slurm]") {
  // Inside a task's allocation the runner starts the launcher by the path it found: srun's
  // options, not mpirun's (srun would read "-np 2" as "-n p").
  dprun::LaunchConfig c;
  c.args = {"--mpi=pmix"};
  CHECK(dprun::launch_command(c, "/usr/bin/srun", 2, {"/opt/dprun", "__trial"}, {}) ==
        Words{"/usr/bin/srun", "--ntasks=2", "--kill-on-bad-exit=1", "--input=0", "--mpi=pmix",
              "/opt/dprun", "__trial"});
}
