/*
 * Test-only libnvidia-ml.so for building and running UCX's CUDA transports over cudasim: one
 * device per index below CUDASIM_DEVICE_COUNT (default 1), none with NVLink. Never installed.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include "nvml.h"

static int initialised;

static unsigned int device_count(void)
{
    const char *s = getenv("CUDASIM_DEVICE_COUNT");
    long n = s ? strtol(s, NULL, 10) : 1;
    return n > 0 ? (unsigned int)n : 0;
}

nvmlReturn_t nvmlInit_v2(void)
{
    initialised = 1;
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlInit(void)
{
    return nvmlInit_v2();
}

nvmlReturn_t nvmlShutdown(void)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    initialised = 0;
    return NVML_SUCCESS;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    default: return "Unknown Error";
    }
}

nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= device_count())
        return NVML_ERROR_INVALID_ARGUMENT;
    /* An opaque, non-NULL handle per index. */
    *device = (nvmlDevice_t)(uintptr_t)(0x1000u + index);
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount,
                                      nvmlFieldValue_t *values)
{
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || valuesCount < 0 || (valuesCount > 0 && values == NULL))
        return NVML_ERROR_INVALID_ARGUMENT;
    for (int i = 0; i < valuesCount; i++) {
        memset(&values[i].value, 0, sizeof(values[i].value));
        if (values[i].fieldId == NVML_FI_DEV_NVLINK_LINK_COUNT) {
            values[i].valueType = NVML_VALUE_TYPE_UNSIGNED_INT;
            values[i].value.uiVal = 0; /* the simulated GPU has no NVLink */
            values[i].nvmlReturn = NVML_SUCCESS;
        } else {
            values[i].nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
        }
    }
    return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo(nvmlDevice_t device, unsigned int link,
                                              nvmlPciInfo_t *pci)
{
    (void)link;
    if (!initialised)
        return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || pci == NULL)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_ERROR_NOT_FOUND;
}
