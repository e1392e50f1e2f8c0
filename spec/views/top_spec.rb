# frozen_string_literal: true

# DdprofRecorder.top's ranking (lib/ddprof_recorder/pprof_views.rb): `sort: :self | :total`
# with one tie-break rule, checked against self and total values computed here from the pprof
# as google-protobuf decodes it (spec/support).
RSpec.describe "DdprofRecorder.top" do
  # Stacks leaf first; main and work hold the same total, spin and sleep the same self.
  let(:pprof) do
    recorder = DdprofRecorder::StackRecorder.new
    [[%w[work main], 100], [%w[spin work main], 350], [%w[sleep work main], 350], [%w[main], 0]].each do |names, cpu|
      recorder.record_sample(names.map { |n| [n, "app.rb", 1] }, [cpu, 1, cpu], {})
    end
    recorder.serialize!
  end

  # `[name, self, total]` of cpu-time per function that has some, from the decoded samples,
  # sorted by `key` (`[self, total] => [...]`, highest first) and then name.
  def expected_rows(&key)
    values = samples_from(decode_pprof(pprof)).each_with_object(Hash.new { |h, k| h[k] = [0, 0] }) do |s, acc|
      cpu = s[:values]["cpu-time"]
      names = s[:frames].map(&:first)
      acc[names.first][0] += cpu
      names.uniq.each { |n| acc[n][1] += cpu }
    end
    values.reject { |_, v| v == [0, 0] }.sort_by { |name, v| [*key.call(v).map(&:-@), name] }.map { |name, v| [name, *v] }
  end

  def ranked(sort)
    DdprofRecorder.top(pprof, sort: sort)[:rows].map { |r| [r[:name], r[:self], r[:total]] }
  end

  it "ranks by self, then total, then name" do
    expect(ranked(:self)).to eq(expected_rows { |self_value, total| [self_value, total] })
    expect(ranked(:self).map(&:first)).to eq(%w[sleep spin work main])
  end

  it "ranks by total, then self, then name, with sort: :total" do
    expect(ranked(:total)).to eq(expected_rows { |self_value, total| [total, self_value] })
    expect(ranked(:total).map(&:first)).to eq(%w[work main sleep spin])
    expect(DdprofRecorder.top(pprof, sort: :total, limit: 1)[:rows].map { |r| r[:name] }).to eq(%w[work])
  end

  it "refuses another sort" do
    expect { DdprofRecorder.top(pprof, sort: :name) }.to raise_error(ArgumentError, "sort must be :self or :total, got :name")
    expect { DdprofRecorder.top(pprof, sort: "total") }.to raise_error(ArgumentError, /got "total"/)
  end
end
