// What the reference loaders make of `qhead quantize` outputs. Runs
// scripts/check_transformers_load.py --qhead <the CLI> with the Python named by
// the environment variable QHEAD_TEST_PYTHON (one with torch, transformers and
// compressed-tensors, the versions scripts/verify_ct_model.py names); skipped
// when it is not set. The script requires that transformers never loads an
// output qhead writes by default to wrong values without an error, that it
// loads each of them equal with dequantize=True, and that an untied embedding
// and head of different schemes are refused unless --mixed-schemes.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>

namespace {

TEST(Exports, TransformersLoadsWhatQuantizeWrites) {
  const char* py = std::getenv("QHEAD_TEST_PYTHON");
  if (!py || !*py) GTEST_SKIP() << "set QHEAD_TEST_PYTHON to a Python with torch, transformers and compressed-tensors";
  const std::filesystem::path script =
      std::filesystem::path(QHEAD_FIXTURE_DIR).parent_path().parent_path() / "scripts" / "check_transformers_load.py";
  ASSERT_TRUE(std::filesystem::exists(script)) << script;
  const std::string cmd =
      std::string("'") + py + "' '" + script.string() + "' --qhead '" + QHEAD_CLI_PATH + "' 2>/dev/null";
  FILE* p = ::popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr) << cmd;
  std::string out;
  std::array<char, 4096> buf;
  for (size_t n; (n = std::fread(buf.data(), 1, buf.size(), p)) > 0;) out.append(buf.data(), n);
  const int status = ::pclose(p);
  ASSERT_TRUE(WIFEXITED(status)) << out;
  EXPECT_EQ(WEXITSTATUS(status), 0) << out;
  EXPECT_NE(out.find("ALL OK"), std::string::npos) << out;
  EXPECT_NE(out.find("mixed_w4g32_w8 (--embedding w4g32 --head w8): refused -> ok"), std::string::npos) << out;
}

}  // namespace
