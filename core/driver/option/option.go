// Package option holds what the functional options of adapters and stores
// share: applying them in order, and the checks of a value with errors
// (*urlparam.OptionError) that name the option the user wrote, so each
// option states only its name, its check and the field it sets, and an
// opener reading a URL can name the parameter instead (urlparam.Table's
// Explain). An adapter outside this module builds its options with it as
// the in-tree ones do:
//
//	func WithAckWait(d time.Duration) Option {
//		return option.Set("mybroker", "WithAckWait", option.AtLeast(d, time.Second), func(c *config) { c.ackWait = d })
//	}
package option

import (
	"cmp"
	"errors"
	"fmt"
	"reflect"

	"github.com/idemq/idemq/core/driver/urlparam"
)

// Apply applies opts to cfg in order, skipping nil options, and returns the
// first error.
func Apply[C any, O ~func(*C) error](cfg *C, opts ...O) error {
	for _, o := range opts {
		if o == nil {
			continue
		}
		if err := o(cfg); err != nil {
			return err
		}
	}
	return nil
}

// ApplyAll applies every non-nil option of opts to cfg, in order, and
// returns all their errors joined, so one start-up names every bad option.
func ApplyAll[C any, O ~func(*C) error](cfg *C, opts ...O) error {
	var errs []error
	for _, o := range opts {
		if o != nil {
			errs = append(errs, o(cfg))
		}
	}
	return errors.Join(errs...)
}

// Set returns an option of package pkg named name: applied, it fails with
// "pkg: option name: err" when err (the value's check) is not nil, and
// otherwise calls set.
func Set[C any](pkg, name string, err error, set func(*C)) func(*C) error {
	if err != nil {
		err = Errorf(pkg, name, "%v", err)
	}
	return Check(err, set)
}

// Check returns an option that, applied, fails with err as it is when err
// is not nil (the value was refused when the option was made), and
// otherwise calls set.
func Check[C any](err error, set func(*C)) func(*C) error {
	return func(c *C) error {
		if err != nil {
			return err
		}
		set(c)
		return nil
	}
}

// Errorf returns the *urlparam.OptionError of option name of package pkg
// with the formatted detail: "pkg: option name: detail".
func Errorf(pkg, name, format string, args ...any) error {
	return &urlparam.OptionError{Pkg: pkg, Option: name, Err: fmt.Errorf(format, args...)}
}

// Refuse returns the error format and args describe when bad, else nil:
// the check of a value no other check here covers.
func Refuse(bad bool, format string, args ...any) error {
	if bad {
		return fmt.Errorf(format, args...)
	}
	return nil
}

// NoneNil checks that no element of vs is nil, naming the first that is
// by its index: "middleware 2 is nil".
func NoneNil[T any](vs []T, what string) error {
	for i, v := range vs {
		if Present(v) != nil {
			return fmt.Errorf("%s %d is nil", what, i)
		}
	}
	return nil
}

// Range checks that v lies in lo..hi.
func Range[T cmp.Ordered](v, lo, hi T) error {
	if v < lo || v > hi {
		return fmt.Errorf("%v is outside %v..%v", v, lo, hi)
	}
	return nil
}

// AtLeast checks that v is lo or more.
func AtLeast[T cmp.Ordered](v, lo T) error {
	if v < lo {
		return fmt.Errorf("%v must be at least %v", v, lo)
	}
	return nil
}

// Positive checks that v is above zero.
func Positive[T cmp.Ordered](v T) error {
	var zero T
	if v <= zero {
		return fmt.Errorf("%v must be positive", v)
	}
	return nil
}

// Present checks that v is not nil: a nil interface, or a nil pointer,
// map, slice, func or channel, is refused.
func Present[T any](v T) error {
	if any(v) == nil {
		return errors.New("nil")
	}
	switch rv := reflect.ValueOf(v); rv.Kind() {
	case reflect.Pointer, reflect.Interface, reflect.Map, reflect.Slice, reflect.Func, reflect.Chan:
		if rv.IsNil() {
			return errors.New("nil")
		}
	}
	return nil
}

// NotNil checks that a func, pointer or interface value given as ok (its
// != nil test) is set; what names the kind of value for the error.
func NotNil(ok bool, what string) error {
	if !ok {
		return errors.New("nil " + what)
	}
	return nil
}
