/*
 * gdrconfig.h: architecture detection for gdrapi.h users (GPUDirect stack in Rust).
 * Defines exactly one of GDRAPI_X86, GDRAPI_POWER, GDRAPI_ARM64 (with no value).
 */
#pragma once

#if defined(__GNUC__)
#  if defined(__powerpc__)
#    define GDRAPI_POWER
#  elif defined(__aarch64__)
#    define GDRAPI_ARM64
#  elif defined(__i386__) || defined(__x86_64__) || defined(__X86__)
#    define GDRAPI_X86
#  else
#    error "architecture is not supported"
#  endif
#else
#  error "compiler not supported"
#endif
