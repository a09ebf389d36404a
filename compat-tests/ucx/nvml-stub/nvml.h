/*
 * Test-only NVML declarations: the handful that UCX's CUDA transports compile against
 * (src/uct/cuda). No wheel on PyPI ships nvml.h, and UCX's configure refuses CUDA without it.
 * Built with libnvidia-ml.so from nvml_stub.c; never installed. The stub describes a GPU with
 * no NVLink, which is what the simulated GPU is.
 */
#ifndef GPUDIRECT_TEST_NVML_STUB_H
#define GPUDIRECT_TEST_NVML_STUB_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum nvmlReturn_enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_UNKNOWN = 999
} nvmlReturn_t;

typedef enum nvmlValueType_enum {
    NVML_VALUE_TYPE_DOUBLE = 0,
    NVML_VALUE_TYPE_UNSIGNED_INT = 1,
    NVML_VALUE_TYPE_UNSIGNED_LONG = 2,
    NVML_VALUE_TYPE_UNSIGNED_LONG_LONG = 3,
    NVML_VALUE_TYPE_SIGNED_LONG_LONG = 4
} nvmlValueType_t;

#define NVML_FI_DEV_NVLINK_LINK_COUNT 91

typedef struct nvmlDevice_st *nvmlDevice_t;

typedef union nvmlValue_st {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
} nvmlValue_t;

typedef struct nvmlFieldValue_st {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    nvmlValueType_t valueType;
    nvmlReturn_t nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

typedef struct nvmlPciInfo_st {
    char busIdLegacy[16];
    unsigned int domain;
    unsigned int bus;
    unsigned int device;
    unsigned int pciDeviceId;
    unsigned int pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

nvmlReturn_t nvmlInit_v2(void);
nvmlReturn_t nvmlShutdown(void);
const char *nvmlErrorString(nvmlReturn_t result);
nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device);
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values);
nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                              nvmlPciInfo_t *pci);
/* configure's AC_CHECK_LIB looks for this name. */
nvmlReturn_t nvmlInit(void);

#ifdef __cplusplus
}
#endif
#endif
