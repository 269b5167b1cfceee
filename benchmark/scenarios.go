package benchmark

import (
	"context"
	"errors"
)

func (s *session) memoryScenario(ctx context.Context, rep *Report) error {
	return errors.New("not yet")
}

func (s *session) growthScenario(ctx context.Context, rep *Report) error {
	return errors.New("not yet")
}
