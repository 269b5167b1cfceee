package benchmark

import (
	"context"
	"errors"
)

// Run measures the configurations cfg names and returns their report. A
// configuration whose run fails is reported as FAILED in the Report; Run
// itself fails only when cfg is invalid or a service cannot be reached.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	return nil, errors.New("benchmark: not implemented yet")
}
