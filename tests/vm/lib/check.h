/* SPDX-License-Identifier: MIT */
/*
 * check.h - the TAP-style checks of the VM test programs under tests/vm/.
 *
 * A program includes it as "../lib/check.h": the path is relative to the program's own
 * directory, so no build line needs an -I for it. Two forms, both printing TAP lines
 * ("ok - ..." / "not ok - ...") that the suites count by exit status:
 *
 * 1. Bailing checks, for test functions that return 0 on success: a failed check prints
 *    "not ok - TEST: FILE:LINE: what" on stderr and leaves the function with CHECK_BAIL.
 *    The program's runner prints "ok - TEST" for a test that returned 0.
 *      FAIL(fmt, ...)          fail unconditionally
 *      CHECK(cond, fmt, ...)   fail unless cond holds
 *      CHECK_ERR(expr, e)      expr must fail (return -1) with errno e
 *      CHECK_OK(expr)          expr must succeed (return >= 0)
 *      CHECK_RET(expr, e)      expr returns 0 or an errno value; it must return e
 *    The program provides, before the first use (the macros name them where they are used):
 *      cur_test     the running test's name, a `const char *` or a char array; a NULL pointer
 *                   leaves the name out ("not ok - FILE:LINE: what").
 *    and may define, before the include:
 *      CHECK_TEST   the expression naming the test (default: cur_test);
 *      CHECK_BAIL   how a failed check leaves (default: `return -1`; `exit(1)` for checks
 *                   outside test functions).
 *
 * 2. Counting reports, for programs that go on after a failure and decide at the end:
 *      check_report(ok, fmt, ...)   prints "ok - MSG" or "not ok - MSG" on stdout (flushed),
 *                                   counts failures in check_failures; thread-safe
 *      NOT_OK(fmt, ...)             check_report(0, ...)
 *    CHECK_REPORT_LIMIT (define before the include; default: no limit): failures after that
 *    many are counted but not printed, so that a broken run stays readable.
 */
#ifndef VM_TEST_CHECK_H
#define VM_TEST_CHECK_H

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#ifndef CHECK_TEST
#define CHECK_TEST cur_test
#endif
#ifndef CHECK_BAIL
#define CHECK_BAIL return -1
#endif
#ifndef CHECK_REPORT_LIMIT
#define CHECK_REPORT_LIMIT INT_MAX
#endif

/* The head of a failure line: "not ok - TEST: FILE:LINE: " (no "TEST: " when test is NULL). */
static inline void check_fail_head(const char *test, const char *file, int line)
{
	if (test)
		fprintf(stderr, "not ok - %s: %s:%d: ", test, file, line);
	else
		fprintf(stderr, "not ok - %s:%d: ", file, line);
}

#define FAIL(...) do { \
		check_fail_head(CHECK_TEST, __FILE__, __LINE__); \
		fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
		CHECK_BAIL; } while (0)
#define CHECK(cond, ...) do { if (!(cond)) { \
		check_fail_head(CHECK_TEST, __FILE__, __LINE__); \
		fprintf(stderr, "check `%s` failed: ", #cond); \
		fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
		CHECK_BAIL; } } while (0)
#define CHECK_ERR(expr, e) do { errno = 0; long r_ = (long)(expr); \
		if (r_ != -1 || errno != (e)) \
			FAIL("`%s` returned %ld errno %d (%s), expected errno %d (%s)", #expr, r_, \
			     errno, strerror(errno), (e), strerror(e)); } while (0)
#define CHECK_OK(expr) do { errno = 0; long r_ = (long)(expr); \
		if (r_ < 0) FAIL("`%s` failed: %s", #expr, strerror(errno)); } while (0)
#define CHECK_RET(expr, e) do { int r_ = (expr); if (r_ != (e)) \
		FAIL("`%s` gave %d (%s), expected %d (%s)", #expr, r_, strerror(r_), (e), \
		     strerror(e)); } while (0)

static int check_failures;
static pthread_mutex_t check_lock = PTHREAD_MUTEX_INITIALIZER;

__attribute__((format(printf, 2, 3)))
static inline void check_report(int ok, const char *fmt, ...)
{
	va_list ap;

	pthread_mutex_lock(&check_lock);
	if (!ok)
		check_failures++;
	if (ok || check_failures <= CHECK_REPORT_LIMIT) {
		fputs(ok ? "ok - " : "not ok - ", stdout);
		va_start(ap, fmt);
		vprintf(fmt, ap);
		va_end(ap);
		fputc('\n', stdout);
		fflush(stdout);
	}
	pthread_mutex_unlock(&check_lock);
}
#define NOT_OK(...) check_report(0, __VA_ARGS__)

#endif /* VM_TEST_CHECK_H */
