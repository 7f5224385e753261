// Stub of CANN acl/acl.h for the CPU binding test (see ../README.md).
#pragma once
typedef void* aclrtStream;
