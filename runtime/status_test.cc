#include "runtime/status.h"

#include <gtest/gtest.h>

namespace vf {
namespace {

Result<int> Half(int x) {
  if (x % 2 != 0) return InvalidArgument("odd number " + std::to_string(x));
  return x / 2;
}

Result<int> Quarter(int x) {
  VF_ASSIGN_OR_RETURN(int h, Half(x));
  VF_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

Status CheckEven(int x) {
  VF_RETURN_IF_ERROR(Half(x).status());
  return Status::Ok();
}

TEST(Status, OkByDefault) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.ToString(), "OK");
}

TEST(Status, ContextPrefixesMessageAndKeepsCode) {
  Status s = DataLoss("bad magic").WithContext("reading train-images");
  EXPECT_EQ(s.code(), StatusCode::kDataLoss);
  EXPECT_EQ(s.message(), "reading train-images: bad magic");
}

TEST(Status, AssignOrReturnPropagatesFirstError) {
  EXPECT_EQ(*Quarter(12), 3);
  Result<int> r = Quarter(6);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(), "odd number 3");
}

TEST(Status, ReturnIfErrorStopsEarly) {
  EXPECT_TRUE(CheckEven(4).ok());
  EXPECT_EQ(CheckEven(5).code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace vf
