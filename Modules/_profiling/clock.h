/* The profilers' clock: a monotonic count of ticks, cheap to read.

   Where the CPU's time-stamp counter runs at a constant rate in every
   state and the kernel itself keeps time with it (Linux's clocksource is
   "tsc", which it picks only once it has found the counter synchronized
   across CPUs), a tick is a cycle of that counter: about 10 ns to read
   here, against about 24 ns for clock_gettime(CLOCK_MONOTONIC) through
   the vDSO.  Elsewhere a tick is a nanosecond of _PyTime_GetPerfCounter().

   Ticks become seconds by the rate measured against the monotonic clock
   over the longest span at hand: from the first use of the clock to the
   moment of the conversion.  Over a second the rate is good to about one
   part in ten million. */

#ifndef SIGHTGLASS_PROFILING_CLOCK_H
#define SIGHTGLASS_PROFILING_CLOCK_H

#include "Python.h"

#if defined(__x86_64__) && defined(__linux__) \
    && (defined(__GNUC__) || defined(__clang__))
#  include <cpuid.h>
#  include <x86intrin.h>
#  define PROFILING_HAVE_TSC 1
#endif

typedef struct {
    int use_tsc;
    /* The first reading of both clocks. */
    int64_t tsc_origin;
    _PyTime_t ns_origin;
} profiling_clock;

#ifdef PROFILING_HAVE_TSC
/* Whether the time-stamp counter is invariant (CPUID) and the kernel
   keeps time with it. */
static int
profiling_tsc_usable(void)
{
    unsigned int eax, ebx, ecx, edx;
    if (!__get_cpuid(0x80000000, &eax, &ebx, &ecx, &edx)
        || eax < 0x80000007)
    {
        return 0;
    }
    __cpuid(0x80000007, eax, ebx, ecx, edx);
    if (!(edx & (1u << 8))) {
        return 0;
    }
    FILE *f = fopen("/sys/devices/system/clocksource/clocksource0/"
                    "current_clocksource", "r");
    if (f == NULL) {
        return 0;
    }
    char source[16] = "";
    int ok = fgets(source, sizeof(source), f) != NULL
             && strcmp(source, "tsc\n") == 0;
    fclose(f);
    return ok;
}
#endif

static inline void
profiling_clock_init(profiling_clock *clock)
{
#ifdef PROFILING_HAVE_TSC
    clock->use_tsc = profiling_tsc_usable();
    clock->tsc_origin = (int64_t)__rdtsc();
#else
    clock->use_tsc = 0;
    clock->tsc_origin = 0;
#endif
    clock->ns_origin = _PyTime_GetPerfCounter();
}

/* Whether the clock is read without a call, by profiling_clock_tsc(). */
static inline int
profiling_clock_is_tsc(const profiling_clock *clock)
{
    return clock->use_tsc;
}

static inline int64_t
profiling_clock_tsc(void)
{
#ifdef PROFILING_HAVE_TSC
    return (int64_t)__rdtsc();
#else
    Py_UNREACHABLE();
#endif
}

static inline int64_t
profiling_clock_now(const profiling_clock *clock)
{
    if (profiling_clock_is_tsc(clock)) {
        return profiling_clock_tsc();
    }
    return (int64_t)_PyTime_GetPerfCounter();
}

/* Seconds per tick. */
static inline double
profiling_clock_seconds_per_tick(const profiling_clock *clock)
{
#ifdef PROFILING_HAVE_TSC
    if (clock->use_tsc) {
        int64_t tsc;
        _PyTime_t ns;
        /* A span of a millisecond at least, for a rate good to about one
           part in ten thousand on a clock read just after the first. */
        do {
            tsc = (int64_t)__rdtsc();
            ns = _PyTime_GetPerfCounter();
        } while (ns - clock->ns_origin < 1000000);
        return (double)(ns - clock->ns_origin) * 1e-9
               / (double)(tsc - clock->tsc_origin);
    }
#endif
    return 1e-9;
}

#endif  /* !SIGHTGLASS_PROFILING_CLOCK_H */
